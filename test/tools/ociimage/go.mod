// Module ociimage builds the small tool that turns a directory into a one-layer OCI image archive
// (used by make image and the test ground's real node). It is separate from the operator's module.
module github.com/keyroll/keyroll/test/tools/ociimage

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
