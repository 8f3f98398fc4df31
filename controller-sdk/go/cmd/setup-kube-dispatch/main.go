// Command setup-kube-dispatch fetches the kube-dispatch tier's binaries of a release for this
// platform into a cache, as setup-envtest fetches envtest's, and prints their directory, for
// controller tests on dispatchtest:
//
//	export KUBE_DISPATCH_ASSETS=$(go run github.com/kube-dispatch/kube-dispatch/controller-sdk/go/cmd/setup-kube-dispatch)
//	go test ./...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatchtest"
)

const usage = `Usage: %s [flags]

Fetches the kube-dispatch tier's binaries (kube-dispatch-dispatcher and
kube-dispatch-loadbalancer) of a release for this platform, unless the cache holds them
already, checks the archive against the SHA-256 published beside it, and prints the directory
that holds them: set KUBE_DISPATCH_ASSETS to it for tests that start the tier with the
dispatchtest package.

The cache is KUBE_DISPATCH_ASSETS_CACHE, else kube-dispatch/assets under the user's cache
directory. The archive is <url>/v<version>/kube-dispatch-<version>-<os>-<arch>.tar.gz.

Flags:
`

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), usage, os.Args[0])
		flag.PrintDefaults()
	}
	version := flag.String("version", dispatch.Version, "the release whose binaries are fetched")
	url := flag.String("url", "", "where releases publish their assets (default KUBE_DISPATCH_ASSETS_URL, else "+dispatchtest.DefaultBinaryAssetsURL+")")
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := dispatchtest.DownloadBinaryAssets(ctx, *url, *version)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
