package dispatchtest

import (
	"errors"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Environment is envtest's Environment with a tier beside its API server: a suite that made
// one with envtest.Environment{...} makes it with dispatchtest.Environment{Environment:
// envtest.Environment{...}}, and Start and Stop run both.
//
//	testEnv := &dispatchtest.Environment{Environment: envtest.Environment{CRDDirectoryPaths: paths}}
//	cfg, err := testEnv.Start()
//	defer testEnv.Stop()
type Environment struct {
	envtest.Environment
	// Tier says how the tier runs.
	Tier Options

	running *Tier
}

// Start starts envtest's API server, then the tier against it (Start).
func (e *Environment) Start() (*rest.Config, error) {
	config, err := e.Environment.Start()
	if err != nil {
		return nil, err
	}
	e.running, err = Start(config, e.Tier)
	if err != nil {
		return nil, errors.Join(err, e.Environment.Stop())
	}
	return config, nil
}

// Stop stops the tier, then envtest's API server.
func (e *Environment) Stop() error {
	if e.running != nil {
		e.running.Stop()
		e.running = nil
	}
	return e.Environment.Stop()
}

// Running is the tier Start started, nil before it and after Stop.
func (e *Environment) Running() *Tier { return e.running }
