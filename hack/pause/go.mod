module local.test/fluxnetes-pause

go 1.26
