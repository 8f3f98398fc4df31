package dispatch

// Version is this SDK's release, as the tier's (Cargo.toml's workspace version; make test
// checks they agree).
const Version = "0.2.0-dev"

// clientName names the SDK in OpenSessionRequest.client.
const clientName = "kube-dispatch-go/" + Version
