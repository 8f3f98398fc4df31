# The Go SDK's example controllers as an image: static binaries and a user, nothing else. The
# entrypoint is the ConfigMap hasher (controller-sdk/go/examples/configmap-hasher); the ported
# Bundle and Mirror controllers (controller-sdk/go/examples/ported) are
# /usr/local/bin/ported-controllers-go, which deploy/examples/ported-go runs. Its context is
# made by deploy/image.sh --go-example:
#   deploy/image.sh --go-example         # buildah: target/image/kube-dispatch-go-hasher-dev.oci.tar
# Layout: /usr/local/bin/configmap-hasher-go and ported-controllers-go, /etc/passwd and
# /etc/group naming the user nonroot (65532) they run as.
FROM scratch
COPY rootfs/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/configmap-hasher-go"]
