// A minimal admission webhook in Go, the control for bench/webhook_latency.py: it answers every
// AdmissionReview "allowed" with a one-operation JSON patch, over net/http's TLS server (HTTP/2
// by ALPN unless -h1). What the API server reports for it is the floor any webhook pays on
// this machine at this load; fluxnetes' webhook is compared against it in the same run.
package main

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
)

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    struct {
		UID string `json:"uid"`
	} `json:"request"`
}

func main() {
	crt := flag.String("cert", "", "TLS certificate (PEM)")
	key := flag.String("key", "", "TLS key (PEM)")
	h1 := flag.Bool("h1", false, "serve HTTP/1.1 only (no h2 in ALPN), like aiohttp")
	flag.Parse()
	patch := base64.StdEncoding.EncodeToString([]byte(`[{"op":"add","path":"/metadata/annotations","value":{"control.fluxnetes.io/seen":"true"}}]`))
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var rv review
		if err == nil {
			err = json.Unmarshal(body, &rv)
		}
		if err != nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":%q,"allowed":true,"patchType":"JSONPatch","patch":%q}}`, rv.Request.UID, patch)
	})
	srv := &http.Server{Handler: mux}
	if *h1 {
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port) // the bench reads the port from the first line
	os.Stdout.Sync()
	if err := srv.ServeTLS(ln, *crt, *key); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
