package dispatchtest_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatchtest"
)

// release is a release archive as deploy/release-assets.sh makes it: the two binaries at the
// top, and something else the fetch must skip.
func release(t *testing.T) []byte {
	t.Helper()
	var out bytes.Buffer
	zipped := gzip.NewWriter(&out)
	archive := tar.NewWriter(zipped)
	for name, body := range map[string]string{
		dispatchtest.DispatcherBinary:   "#!/bin/sh\necho dispatcher\n",
		dispatchtest.LoadBalancerBinary: "#!/bin/sh\necho loadbalancer\n",
		"LICENSE":                       "Apache-2.0\n",
	} {
		header := &tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}
		if err := archive.WriteHeader(header); err != nil {
			t.Fatal(err)
		}
		if _, err := archive.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := archive.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zipped.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// serve publishes archive for version as a release does, with checksum as its .sha256, on a
// loopback server; it counts the requests.
func serve(t *testing.T, version string, archive []byte, checksum string) (string, *atomic.Int32) {
	t.Helper()
	var requests atomic.Int32
	path := "/releases/v" + version + "/" + dispatchtest.AssetsArchiveName(version)
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		switch r.URL.Path {
		case path:
			_, _ = w.Write(archive)
		case path + ".sha256":
			fmt.Fprintf(w, "%s  %s\n", checksum, dispatchtest.AssetsArchiveName(version))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(server.Close)
	return server.URL + "/releases", &requests
}

// A release's binaries are fetched once, checked against the published SHA-256, unpacked
// executable into the cache, and taken from there afterwards without a request.
func TestReleaseBinariesAreFetchedOnceAndCached(t *testing.T) {
	t.Setenv("KUBE_DISPATCH_ASSETS_CACHE", t.TempDir())
	archive := release(t)
	url, requests := serve(t, "9.8.7", archive, fmt.Sprintf("%x", sha256.Sum256(archive)))
	dir, err := dispatchtest.DownloadBinaryAssets(context.Background(), url, "9.8.7")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{dispatchtest.DispatcherBinary, dispatchtest.LoadBalancerBinary} {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil || info.Mode().Perm()&0o100 == 0 {
			t.Fatalf("%s not fetched as an executable: %v %v", name, info, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "LICENSE")); err == nil {
		t.Error("what is not a binary of the tier was unpacked too")
	}
	fetched := requests.Load()
	again, err := dispatchtest.DownloadBinaryAssets(context.Background(), url, "9.8.7")
	if err != nil || again != dir {
		t.Fatalf("second fetch: %q %v, want the cached %q", again, err, dir)
	}
	if requests.Load() != fetched {
		t.Errorf("the cached release was fetched again: %d requests, then %d", fetched, requests.Load())
	}
	found, err := dispatchtest.FindBinary(dir, dispatchtest.DispatcherBinary)
	if err != nil || found != filepath.Join(dir, dispatchtest.DispatcherBinary) {
		t.Errorf("FindBinary: %q %v", found, err)
	}
}

// An archive that does not match its published SHA-256, or a version that was never released,
// is refused with what went wrong, and nothing is kept.
func TestAReleaseThatDoesNotMatchOrDoesNotExistIsRefused(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("KUBE_DISPATCH_ASSETS_CACHE", cache)
	archive := release(t)
	url, _ := serve(t, "9.8.7", archive, strings.Repeat("ab", sha256.Size))
	_, err := dispatchtest.DownloadBinaryAssets(context.Background(), url, "9.8.7")
	if err == nil || !strings.Contains(err.Error(), "its .sha256 says abab") {
		t.Errorf("a corrupt archive: %v", err)
	}
	_, err = dispatchtest.DownloadBinaryAssets(context.Background(), url, "0.0.1")
	if err == nil || !strings.Contains(err.Error(), "404 Not Found (is this a released version?") {
		t.Errorf("a version never released: %v", err)
	}
	left, err := os.ReadDir(cache)
	if err != nil || len(left) != 0 {
		t.Errorf("the cache keeps %v after refusals (%v)", left, err)
	}
}

// The archive deploy/release-assets.sh made (in KD_RELEASE_ASSETS, laid out as a release
// publishes it: v<version>/<archive> and its .sha256), fetched as a controller's tests fetch
// it, gives binaries of this SDK's version that run. `make test` sets KD_RELEASE_ASSETS.
func TestTheReleaseArchiveIsFetchedAndRuns(t *testing.T) {
	assets := os.Getenv("KD_RELEASE_ASSETS")
	if assets == "" {
		t.Skip("KD_RELEASE_ASSETS names no release assets (make test makes them)")
	}
	t.Setenv("KUBE_DISPATCH_ASSETS_CACHE", t.TempDir())
	server := httptest.NewServer(http.FileServer(http.Dir(assets)))
	t.Cleanup(server.Close)
	dir, err := dispatchtest.DownloadBinaryAssets(context.Background(), server.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{dispatchtest.DispatcherBinary, dispatchtest.LoadBalancerBinary} {
		out, err := exec.Command(filepath.Join(dir, name), "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), dispatch.Version) {
			t.Errorf("%s --version: %q %v, want version %s", name, out, err, dispatch.Version)
		}
	}
}
