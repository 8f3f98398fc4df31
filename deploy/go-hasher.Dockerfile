# The Go SDK's example controller (controller-sdk/go/examples/configmap-hasher) as an image: a
# static binary and a user, nothing else. Its context is made by deploy/image.sh --go-example:
#   deploy/image.sh --go-example         # buildah: target/image/kube-dispatch-go-hasher-dev.oci.tar
# Layout: /usr/local/bin/configmap-hasher-go, /etc/passwd and /etc/group naming the user
# nonroot (65532) it runs as.
FROM scratch
COPY rootfs/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/configmap-hasher-go"]
