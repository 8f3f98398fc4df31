package dispatchtest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
)

// The tier's release assets are fetched and cached as setup-envtest fetches the API server's:
// one archive per release and platform,
//
//	<assets URL>/v<version>/kube-dispatch-<version>-<GOOS>-<GOARCH>.tar.gz
//
// holding kube-dispatch-dispatcher and kube-dispatch-loadbalancer at its top, beside its
// SHA-256 in hex under the same name with ".sha256" appended (deploy/release-assets.sh makes
// both). An archive is kept, unpacked, in the cache directory, one directory per version and
// platform, and fetched again only when that directory is missing.

// DefaultBinaryAssetsURL is where the project's releases publish their assets.
const DefaultBinaryAssetsURL = "https://github.com/kube-dispatch/kube-dispatch/releases/download"

// MaxAssetsArchiveBytes bounds what one download reads: the archive of two static binaries is
// tens of megabytes.
const MaxAssetsArchiveBytes = 512 << 20

// assetsTimeout bounds one download, archive and checksum together.
const assetsTimeout = 5 * time.Minute

// AssetsCacheDirectory is where fetched binaries are kept: KUBE_DISPATCH_ASSETS_CACHE, else
// kube-dispatch/assets under the user's cache directory (os.UserCacheDir).
func AssetsCacheDirectory() (string, error) {
	if dir := os.Getenv("KUBE_DISPATCH_ASSETS_CACHE"); dir != "" {
		return dir, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("dispatchtest: no cache directory for the tier's binaries (set KUBE_DISPATCH_ASSETS_CACHE): %w", err)
	}
	return filepath.Join(cache, "kube-dispatch", "assets"), nil
}

// AssetsArchiveName is the name of the release archive of version for this platform.
func AssetsArchiveName(version string) string {
	return fmt.Sprintf("kube-dispatch-%s-%s-%s.tar.gz", version, runtime.GOOS, runtime.GOARCH)
}

// DownloadBinaryAssets returns the directory holding the tier's binaries of version (this
// SDK's, dispatch.Version, when empty), fetched from url (KUBE_DISPATCH_ASSETS_URL, else
// DefaultBinaryAssetsURL, when empty) into the cache unless they are there already. The
// archive must match the SHA-256 published beside it.
func DownloadBinaryAssets(ctx context.Context, url, version string) (string, error) {
	if version == "" {
		version = dispatch.Version
	}
	if url == "" {
		url = os.Getenv("KUBE_DISPATCH_ASSETS_URL")
	}
	if url == "" {
		url = DefaultBinaryAssetsURL
	}
	cache, err := AssetsCacheDirectory()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, fmt.Sprintf("%s-%s-%s", version, runtime.GOOS, runtime.GOARCH))
	if hasBinaries(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("dispatchtest: cannot make the cache directory: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, assetsTimeout)
	defer cancel()
	archive := strings.TrimSuffix(url, "/") + "/v" + version + "/" + AssetsArchiveName(version)
	sum, err := fetchChecksum(ctx, archive+".sha256")
	if err != nil {
		return "", err
	}
	// Unpacked beside the final directory and renamed into place: tests of several packages
	// fetching at once each unpack their own copy, and one rename wins. What a killed fetch
	// left goes first.
	removeAbandoned(cache)
	unpacked, err := os.MkdirTemp(cache, ".fetching-")
	if err != nil {
		return "", fmt.Errorf("dispatchtest: cannot unpack the tier's binaries: %w", err)
	}
	defer os.RemoveAll(unpacked)
	if err := fetchArchive(ctx, archive, sum, unpacked); err != nil {
		return "", err
	}
	if err := os.Rename(unpacked, dir); err != nil && !hasBinaries(dir) {
		return "", fmt.Errorf("dispatchtest: cannot keep the tier's binaries in %s: %w", dir, err)
	}
	return dir, nil
}

// removeAbandoned removes what fetches killed before their end left in cache: unpacking
// directories older than a fetch may take.
func removeAbandoned(cache string) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	for _, entry := range entries {
		info, err := entry.Info()
		if err == nil && strings.HasPrefix(entry.Name(), ".fetching-") && time.Since(info.ModTime()) > 2*assetsTimeout {
			_ = os.RemoveAll(filepath.Join(cache, entry.Name()))
		}
	}
}

// hasBinaries is whether dir holds both of the tier's binaries.
func hasBinaries(dir string) bool {
	for _, name := range []string{DispatcherBinary, LoadBalancerBinary} {
		if info, err := os.Stat(filepath.Join(dir, name)); err != nil || !info.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// get answers a GET of url, or says why it cannot.
func get(ctx context.Context, url string) (*http.Response, error) {
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("dispatchtest: %s: %w", url, err)
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		return nil, fmt.Errorf("dispatchtest: cannot fetch the tier's binaries: %w", err)
	}
	if response.StatusCode != http.StatusOK {
		response.Body.Close()
		return nil, fmt.Errorf("dispatchtest: cannot fetch the tier's binaries: GET %s: %s (is this a released version? set KUBE_DISPATCH_ASSETS to binaries built with cargo build --bins instead)", url, response.Status)
	}
	return response, nil
}

// fetchChecksum is the SHA-256 a .sha256 file publishes (its first field, in hex).
func fetchChecksum(ctx context.Context, url string) ([]byte, error) {
	response, err := get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer response.Body.Close()
	line, err := bufio.NewReader(io.LimitReader(response.Body, 1024)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("dispatchtest: %s: %w", url, err)
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return nil, fmt.Errorf("dispatchtest: %s holds no SHA-256", url)
	}
	sum, err := hex.DecodeString(fields[0])
	if err != nil || len(sum) != sha256.Size {
		return nil, fmt.Errorf("dispatchtest: %s holds no SHA-256: %q", url, fields[0])
	}
	return sum, nil
}

// fetchArchive unpacks the tier's binaries of the archive at url into dir, once its SHA-256 is
// found to be sum.
func fetchArchive(ctx context.Context, url string, sum []byte, dir string) error {
	response, err := get(ctx, url)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	// Kept whole before anything is unpacked: nothing of an archive that does not match runs.
	kept, err := os.CreateTemp(dir, "archive-")
	if err != nil {
		return fmt.Errorf("dispatchtest: cannot keep the archive: %w", err)
	}
	defer kept.Close()
	hash := sha256.New()
	n, err := io.Copy(io.MultiWriter(kept, hash), io.LimitReader(response.Body, MaxAssetsArchiveBytes+1))
	if err != nil {
		return fmt.Errorf("dispatchtest: cannot fetch %s: %w", url, err)
	}
	if n > MaxAssetsArchiveBytes {
		return fmt.Errorf("dispatchtest: %s is larger than %d bytes", url, MaxAssetsArchiveBytes)
	}
	if got := hash.Sum(nil); !bytes.Equal(got, sum) {
		return fmt.Errorf("dispatchtest: %s has SHA-256 %x, its .sha256 says %x: not used", url, got, sum)
	}
	if _, err := kept.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := unpack(kept, dir); err != nil {
		return fmt.Errorf("dispatchtest: %s: %w", url, err)
	}
	if err := os.Remove(kept.Name()); err != nil {
		return err
	}
	if !hasBinaries(dir) {
		return fmt.Errorf("dispatchtest: %s holds no %s and %s at its top", url, DispatcherBinary, LoadBalancerBinary)
	}
	return nil
}

// unpack writes the tier's binaries found at the top of the gzipped tar archive into dir,
// executable; anything else in it is skipped.
func unpack(archive io.Reader, dir string) error {
	unzipped, err := gzip.NewReader(archive)
	if err != nil {
		return err
	}
	entries := tar.NewReader(unzipped)
	for {
		header, err := entries.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(header.Name, "./")
		if header.Typeflag != tar.TypeReg || (name != DispatcherBinary && name != LoadBalancerBinary) {
			continue
		}
		out, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			return err
		}
		n, err := io.Copy(out, io.LimitReader(entries, MaxAssetsArchiveBytes+1))
		if err := errors.Join(err, out.Close()); err != nil {
			return err
		}
		if n > MaxAssetsArchiveBytes {
			return fmt.Errorf("%s is larger than %d bytes", name, MaxAssetsArchiveBytes)
		}
	}
}
