# syntax=docker/dockerfile:1
# idemgate: one static binary on distroless, running as non-root UID 65532.
#   docker build -t idemgate:local --build-arg VERSION=$(git describe --tags --always) .
#   docker run --rm idemgate:local keygen
# The default command serves the config mounted at /etc/idemgate/idemgate.yaml
# (docker-compose.yaml mounts envoy/idemgate.yaml there; k8s/ passes --config).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
# CGO off: a static binary that needs no libc, so it runs on distroless/static.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath \
      -ldflags "-s -w -X github.com/idemgate/idemgate/cmd/idemgate/mainlib.Version=${VERSION}" \
      -o /out/idemgate ./cmd/idemgate

# The demo payments API (cmd/idemgate-demo --upstream-only) for docker-compose's
# payments service: `docker build --target demo`. A stage of its own, so the idemgate
# image (the default, last stage) carries no demo code; BuildKit skips it otherwise.
FROM build AS build-demo
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/idemgate-demo ./cmd/idemgate-demo

FROM gcr.io/distroless/static-debian12:nonroot AS demo
COPY --from=build-demo /out/idemgate-demo /usr/local/bin/idemgate-demo
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/idemgate-demo"]
CMD ["--upstream-only"]

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/idemgate /usr/local/bin/idemgate
USER 65532:65532
# 50051: gRPC (ext_proc + grpc.health.v1); 9090: admin (/metrics /healthz /readyz);
# 9091: approval_listen (the approvers' API and page, DESIGN section 10).
EXPOSE 50051 9090 9091
ENTRYPOINT ["/usr/local/bin/idemgate"]
CMD ["serve", "--config", "/etc/idemgate/idemgate.yaml"]
