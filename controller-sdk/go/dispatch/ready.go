package dispatch

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
)

// built are the controllers this process built, for SessionsReady.
var built struct {
	mu          sync.Mutex
	controllers []*engine.Metrics
}

// trackReadiness counts m's controller in SessionsReady until the returned func is called (as
// its runner stops).
func trackReadiness(m *engine.Metrics) (untrack func()) {
	built.mu.Lock()
	defer built.mu.Unlock()
	built.controllers = append(built.controllers, m)
	return func() {
		built.mu.Lock()
		defer built.mu.Unlock()
		built.controllers = slices.DeleteFunc(built.controllers, func(c *engine.Metrics) bool { return c == m })
	}
}

// SessionsReady is a readiness check (manager.AddReadyzCheck) that passes once every controller
// the SDK built in this process, and not stopped since, has a session open with a dispatcher
// (and fails while there is none): a replica that cannot reach the tier serves nothing, so a
// rolling update of the controller should wait for it.
//
//	mgr.AddReadyzCheck("kube-dispatch", dispatch.SessionsReady)
var SessionsReady healthz.Checker = func(*http.Request) error {
	built.mu.Lock()
	defer built.mu.Unlock()
	if len(built.controllers) == 0 {
		return errors.New("no controller of the kube-dispatch SDK is running")
	}
	for _, m := range built.controllers {
		if m.Open.Load() == 0 {
			return fmt.Errorf("controller group %s has no dispatcher session open", m.Controller)
		}
	}
	return nil
}
