# The loom image: the manager's static binary (/loom) and the node agent's
# (/loom-node-agent, which loads NVML) on distroless, as a non-root user.
# (These build machines have no container engine; CI builds the binary, not
# this image.)
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux TARGETARCH=amd64
# The release version (docker build --build-arg VERSION=v0.2.0).
ARG VERSION=dev
# The manager needs no cgo and builds static. go-nvml loads
# libnvidia-ml.so at run time through dlopen, which needs cgo: only the node
# agent links it.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X github.com/loom-dev/loom/internal/manager.buildVersion=$VERSION" -o /out/loom ./cmd/manager && \
    CGO_ENABLED=1 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X github.com/loom-dev/loom/internal/manager.buildVersion=$VERSION" -o /out/loom-node-agent ./cmd/node-agent

FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/loom /out/loom-node-agent /
USER 65532:65532
ENTRYPOINT ["/loom"]
CMD ["manager"]
