package dispatch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Where a pod of the tier's deployment finds its CA bundle and its projected token.
const (
	DefaultCAFile    = "/var/run/secrets/kube-dispatch/ca.crt"
	DefaultTokenFile = "/var/run/secrets/kube-dispatch/token"
)

// connectTimeout bounds each connection attempt.
const connectTimeout = 5 * time.Second

// tokenReread is how long a token read from its file is used before the file is read again
// (the kubelet rotates projected tokens well before they expire). A variable for the tests
// (export_test.go), taken by each bearer as it is made.
var tokenReread = 30 * time.Second

// Credentials say how a replica reaches the tier: TLS with a CA bundle (read again for every
// new connection, so a rotated CA is picked up) or plaintext, and the bearer token it sends
// (a projected ServiceAccount token read again as the kubelet rotates it, a fixed one, or
// none). The zero value is plaintext without a token: for tests only.
type Credentials struct {
	tls *tlsSettings
	// token sends the bearer credential, if any.
	token *bearer
}

type tlsSettings struct {
	caFile string
	// serverName is the name verified on the dispatchers' certificates; empty: each address's
	// own host.
	serverName string
	// loadBalancerServerName is the name verified on the load balancer's certificate.
	loadBalancerServerName string
}

// CredentialsFromEnv reads what the environment says, with the names and defaults the Rust SDK
// and the servers' flags use:
//
//	KD_INSECURE                      plaintext (true/1/yes/on)      default: TLS
//	KD_TLS_CA_FILE                   CA bundle the servers chain to  default: DefaultCAFile
//	KD_TLS_SERVER_NAME               name on the dispatchers' certificate
//	KD_LOADBALANCER_TLS_SERVER_NAME  name on the load balancer's certificate
//	KD_ALLOW_ANONYMOUS               send no token (true/1/yes/on)   default: send one
//	KD_TOKEN_FILE                    the projected token             default: DefaultTokenFile
func CredentialsFromEnv() Credentials {
	flag := func(name string) bool {
		switch strings.ToLower(os.Getenv(name)) {
		case "true", "1", "yes", "on":
			return true
		}
		return false
	}
	orDefault := func(name, fallback string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return fallback
	}
	var c Credentials
	if !flag("KD_INSECURE") {
		c = TLSCredentials(orDefault("KD_TLS_CA_FILE", DefaultCAFile)).
			WithServerName(os.Getenv("KD_TLS_SERVER_NAME")).
			WithLoadBalancerServerName(os.Getenv("KD_LOADBALANCER_TLS_SERVER_NAME"))
	}
	if !flag("KD_ALLOW_ANONYMOUS") {
		c = c.WithTokenFile(orDefault("KD_TOKEN_FILE", DefaultTokenFile))
	}
	return c
}

// TLSCredentials verify the servers against the CA bundle in caFile.
func TLSCredentials(caFile string) Credentials {
	return Credentials{tls: &tlsSettings{caFile: caFile}}
}

// WithServerName verifies the dispatchers' certificates under name (their addresses are pod
// IPs).
func (c Credentials) WithServerName(name string) Credentials {
	return c.withTLS(func(t *tlsSettings) { t.serverName = name })
}

// WithLoadBalancerServerName verifies the load balancer's certificate under name.
func (c Credentials) WithLoadBalancerServerName(name string) Credentials {
	return c.withTLS(func(t *tlsSettings) { t.loadBalancerServerName = name })
}

// withTLS is c with a copy of its TLS settings changed (values share nothing); plaintext
// credentials are returned as they are.
func (c Credentials) withTLS(change func(*tlsSettings)) Credentials {
	if c.tls != nil {
		t := *c.tls
		change(&t)
		c.tls = &t
	}
	return c
}

// WithTokenFile sends the token in path, read again at most every 30 seconds.
func (c Credentials) WithTokenFile(path string) Credentials {
	c.token = &bearer{path: path, reread: tokenReread}
	return c
}

// WithToken sends token (tests, tools that obtained one with TokenRequest).
func (c Credentials) WithToken(token string) Credentials {
	c.token = &bearer{fixed: strings.TrimSpace(token)}
	return c
}

// forLoadBalancer is c as it reaches the load balancer first dialled at address: its
// certificate is its own (a compromised load balancer cannot pose as a dispatcher), verified
// under the load-balancer name if set, else under the host of address when that is a name,
// else under each address's own host.
func (c Credentials) forLoadBalancer(address string) Credentials {
	return c.withTLS(func(t *tlsSettings) {
		t.serverName = t.loadBalancerServerName
		if t.serverName == "" {
			t.serverName = hostName(address)
		}
	})
}

// dial opens a client connection to address (host:port, or a URL whose scheme matches the
// transport). The CA bundle is read now, so each new connection uses the current one.
func (c Credentials) dial(address string, options ...grpc.DialOption) (*grpc.ClientConn, error) {
	target, err := c.target(address)
	if err != nil {
		return nil, err
	}
	transport := insecure.NewCredentials()
	if c.tls != nil {
		pem, err := os.ReadFile(c.tls.caFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read the CA bundle %s: %w", c.tls.caFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the CA bundle %s holds no PEM certificate", c.tls.caFile)
		}
		transport = grpccreds.NewTLS(&tls.Config{
			RootCAs:    pool,
			ServerName: c.tls.serverName,
			MinVersion: tls.VersionTLS12,
		})
	}
	options = append(options,
		grpc.WithTransportCredentials(transport),
		// A black-holed address fails in seconds, not after gRPC's default 20.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: connectTimeout}),
	)
	if c.token != nil {
		options = append(options, grpc.WithPerRPCCredentials(c.token))
	}
	return grpc.NewClient(target, options...)
}

// target checks address as the Rust SDK does: host:port, or http:// or https:// (matching the
// transport) then host:port and an optional trailing slash.
func (c Credentials) target(address string) (string, error) {
	configured := "http"
	if c.tls != nil {
		configured = "https"
	}
	rest := address
	if scheme, after, found := strings.Cut(address, "://"); found {
		switch {
		case scheme == configured:
		case scheme == "http" || scheme == "https":
			configuredName := "plaintext"
			if c.tls != nil {
				configuredName = "TLS"
			}
			return "", fmt.Errorf("address %q asks for %s but the credentials are %s", address, scheme, configuredName)
		default:
			return "", fmt.Errorf("address %q: unknown scheme %q", address, scheme)
		}
		rest = after
	}
	rest = strings.TrimRight(rest, "/")
	if rest == "" || strings.Contains(rest, "/") {
		return "", fmt.Errorf("address %q: expected host:port", address)
	}
	if _, _, err := net.SplitHostPort(rest); err != nil {
		return "", fmt.Errorf("address %q: expected host:port: %w", address, err)
	}
	return "passthrough:///" + rest, nil
}

// hostName is the host of address when it is a name, not an IP; empty otherwise.
func hostName(address string) string {
	if _, after, found := strings.Cut(address, "://"); found {
		address = after
	}
	authority, _, _ := strings.Cut(address, "/")
	if strings.HasPrefix(authority, "[") {
		return ""
	}
	host := authority
	if i := strings.LastIndexByte(authority, ':'); i >= 0 {
		host = authority[:i]
	}
	if host == "" {
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	return host
}

// bearer adds "authorization: Bearer <token>" to every call, from a fixed token or from a file
// read again at most every tokenReread; a failed re-read keeps the previous token (a rotation
// in progress). It never prints the token.
type bearer struct {
	fixed  string
	path   string
	reread time.Duration

	mu     sync.Mutex
	token  string
	readAt time.Time
}

func (b *bearer) current() (string, error) {
	if b.path == "" {
		if b.fixed == "" {
			return "", nil
		}
		return b.fixed, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.token != "" && time.Since(b.readAt) < b.reread {
		return b.token, nil
	}
	raw, err := os.ReadFile(b.path)
	token := strings.TrimSpace(string(raw))
	if err == nil && (token == "" || !printableASCII(token)) {
		err = fmt.Errorf("the token file %s holds no usable token (empty, or not printable ASCII)", b.path)
	}
	if err != nil {
		if b.token != "" {
			return b.token, nil
		}
		return "", status.Errorf(codes.Unauthenticated, "cannot read the token file %s: %v", b.path, err)
	}
	b.token, b.readAt = token, time.Now()
	return token, nil
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b *bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	token, err := b.current()
	if err != nil || token == "" {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: a plaintext tier (tests,
// a mesh that encrypts) may still ask for a token.
func (b *bearer) RequireTransportSecurity() bool { return false }

// String never shows the token.
func (b *bearer) String() string {
	if b.path != "" {
		return "Bearer(file " + b.path + ")"
	}
	return "Bearer(<token>)"
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
