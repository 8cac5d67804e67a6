# The manager image: a static binary on a distroless, non-root base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /keyroll . && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /keyroll-probe ./cmd/keyroll-probe

FROM gcr.io/distroless/static:nonroot
# The labels make image gives its image too (make docker-build passes VERSION and REVISION).
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title=keyroll \
      org.opencontainers.image.description="The keyroll operator: Redis with credentials from Vault, rotated without downtime" \
      org.opencontainers.image.source=https://github.com/keyroll/keyroll \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$REVISION
COPY --from=build /keyroll /keyroll
# The Redis pods' probe sidecar, which keyroll runs from this image.
COPY --from=build /keyroll-probe /keyroll-probe
USER 65532:65532
ENTRYPOINT ["/keyroll"]
