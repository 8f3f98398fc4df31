package dispatch

import (
	"time"

	"google.golang.org/grpc"
)

// SetTokenReread makes the token files of credentials made from now on be read again after d,
// and returns what restores the default.
func SetTokenReread(d time.Duration) (restore func()) {
	previous := tokenReread
	tokenReread = d
	return func() { tokenReread = previous }
}

// Dial connects to address with c, as the SDK's sessions do.
func Dial(c Credentials, address string) (*grpc.ClientConn, error) { return c.dial(address) }
