package dispatch

import "testing"

// The load balancer is verified under its own name (the one set, else its address's host name),
// never the dispatchers', and deriving its credentials leaves the dispatchers' unchanged.
func TestTheLoadBalancerIsVerifiedUnderItsOwnName(t *testing.T) {
	base := TLSCredentials("ca.crt").WithServerName("dispatchers.svc")
	if got := base.forLoadBalancer("lb.ns.svc:7071").tls.serverName; got != "lb.ns.svc" {
		t.Fatalf("by address: %q", got)
	}
	if got := base.forLoadBalancer("10.0.0.1:7071").tls.serverName; got != "" {
		t.Fatalf("an IP names nothing: %q", got)
	}
	named := base.WithLoadBalancerServerName("lb.example")
	if got := named.forLoadBalancer("10.0.0.1:7071").tls.serverName; got != "lb.example" {
		t.Fatalf("set: %q", got)
	}
	if base.tls.serverName != "dispatchers.svc" || base.tls.loadBalancerServerName != "" {
		t.Fatalf("the base changed: %+v", *base.tls)
	}
	if (Credentials{}).WithServerName("x").tls != nil {
		t.Fatal("plaintext grew TLS settings")
	}
}

func TestAddressesMustMatchTheTransport(t *testing.T) {
	tls, plain := TLSCredentials("ca.crt"), Credentials{}
	for _, c := range []struct {
		creds   Credentials
		address string
		ok      bool
	}{
		{plain, "127.0.0.1:7070", true},
		{plain, "http://127.0.0.1:7070/", true},
		{plain, "https://127.0.0.1:7070", false},
		{tls, "http://127.0.0.1:7070", false},
		{tls, "https://host:7070", true},
		{plain, "ftp://host:1", false},
		{plain, "host:1/path", false},
		{plain, "", false},
	} {
		if _, err := c.creds.target(c.address); (err == nil) != c.ok {
			t.Errorf("%q: %v", c.address, err)
		}
	}
}
