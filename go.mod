module github.com/ckptfs/ckptfs

go 1.25.0

require (
	github.com/dgraph-io/ristretto/v2 v2.4.2
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/klauspost/compress v1.19.2
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.19.0
	golang.org/x/sys v0.36.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
