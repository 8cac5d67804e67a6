# The manager image: a static binary on a distroless, non-root base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /keyroll .

FROM gcr.io/distroless/static:nonroot
COPY --from=build /keyroll /keyroll
USER 65532:65532
ENTRYPOINT ["/keyroll"]
