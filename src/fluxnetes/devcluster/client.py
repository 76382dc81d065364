"""Talking to a dev cluster's API server as admin: kubectl (the built one) and plain HTTPS
requests with the cluster CA and the admin client certificate."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from fluxnetes.devcluster.apicalls import http_ok, urlopen
from fluxnetes.devcluster.errors import ClusterError
from fluxnetes.devcluster.pki import ClusterPKI


class ClusterClient:
    """The admin client of one cluster; the TLS context is made once, on first use."""

    def __init__(self, api_url: str, pki: ClusterPKI, kubectl: Path, kubeconfig: Path,
                 cache_dir: Path) -> None:
        self.api_url = api_url
        self.pki = pki
        self._kubectl = kubectl
        self._kubeconfig = kubeconfig
        self._cache_dir = cache_dir
        self._ssl: ssl.SSLContext | None = None

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; raises ClusterError on failure if check."""
        argv = [
            str(self._kubectl),
            f"--kubeconfig={self._kubeconfig}",
            f"--cache-dir={self._cache_dir}",
            *args,
        ]
        try:
            res = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"kubectl {' '.join(args)} timed out after {timeout:.0f} s") from exc
        if check and res.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed (exit {res.returncode}): {res.stderr.strip()}"
            )
        return res

    def kubectl_json(self, *args: str, timeout: float = 120.0) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the cluster CA and presenting the admin client certificate."""
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
            ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
            self._ssl = ctx
        return self._ssl

    def api_get(self, path: str, timeout: float = 10.0) -> Any:
        """GET a JSON document from the apiserver as admin (e.g. '/api/v1/nodes')."""
        req = urllib.request.Request(self.api_url + path, headers={"Accept": "application/json"})
        with urlopen(req, self.ssl_context(), timeout) as resp:
            return json.loads(resp.read())

    def api_call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> Any:
        """One request as admin; returns the decoded JSON answer (None when empty). HTTP errors
        raise urllib.error.HTTPError (its `code` says which), connection errors OSError."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={"Accept": "application/json", "Content-Type": content_type},
        )
        with urlopen(req, self.ssl_context(), timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def api_ok(self, path: str) -> bool:
        return http_ok(self.api_url + path, self.ssl_context())

    def exists(self, path: str) -> bool:
        try:
            self.api_get(path)
        except (urllib.error.URLError, OSError):
            return False
        return True
