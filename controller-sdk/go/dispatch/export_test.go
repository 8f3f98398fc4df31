package dispatch

import "time"

// SetTokenReread makes the token files of credentials made from now on be read again after d,
// and returns what restores the default.
func SetTokenReread(d time.Duration) (restore func()) {
	previous := tokenReread
	tokenReread = d
	return func() { tokenReread = previous }
}
