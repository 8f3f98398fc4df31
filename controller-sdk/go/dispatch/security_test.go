package dispatch_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"
	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/tiertest"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// testIdentity is the local cluster's test ServiceAccount (tiertest.Tester).
const testIdentityNamespace, testIdentity = "kube-dispatch-tests", "tester"

// boundToken is a token of the test identity for the tier's audience, bound to a Secret of its
// own: deleting the Secret revokes it, as a pod's deletion revokes its projected token.
func boundToken(t *testing.T, clientset kubernetes.Interface) (token string, revoke func()) {
	t.Helper()
	ctx := context.Background()
	secrets := clientset.CoreV1().Secrets(testIdentityNamespace)
	secret, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{GenerateName: "go-sdk-token-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	revoke = func() { _ = secrets.Delete(ctx, secret.Name, metav1.DeleteOptions{}) }
	t.Cleanup(revoke)
	expiry := int64(600)
	issued, err := clientset.CoreV1().ServiceAccounts(testIdentityNamespace).CreateToken(ctx, testIdentity, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{"kube-dispatch"},
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: secret.Name, UID: secret.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return issued.Status.Token, revoke
}

// authenticated says whether the API server still accepts token for the tier's audience.
func authenticated(t *testing.T, clientset kubernetes.Interface, token string) bool {
	t.Helper()
	review, err := clientset.AuthenticationV1().TokenReviews().Create(context.Background(), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{"kube-dispatch"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return review.Status.Authenticated
}

// refused waits until the dispatcher at address refuses a call made with token
// (Unauthenticated), failing after 30 s.
func refused(t *testing.T, address, token string) {
	t.Helper()
	ca := filepath.Join(tiertest.ClusterDir(), "pki", "ca.crt")
	conn, err := dispatch.Dial(dispatch.TLSCredentials(ca).WithToken(token), address)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := pb.NewDispatcherClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.Ack(ctx, &pb.AckRequest{SessionId: "no-such-session"})
		cancel()
		if status.Code(err) == codes.Unauthenticated {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dispatcher still takes the revoked token after 30 s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// writeToken replaces the token file at once, as the kubelet rotates a projected token (a
// new file renamed over the old).
func writeToken(t *testing.T, path, token string) {
	t.Helper()
	next := path + ".next"
	if err := os.WriteFile(next, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
}

// A Go replica on a tier secured as deployed (TLS against the cluster's CA, TokenReview and
// SubjectAccessReview) connects with the CA bundle and a projected token, and keeps
// reconciling when the token is rotated on disk and the old one revoked: it sends the new one.
func TestTLSAndARotatedTokenKeepTheReplicaServing(t *testing.T) {
	// The projected token is read again every half second here (30 s by default).
	defer dispatch.SetTokenReread(500 * time.Millisecond)()
	config := tiertest.Config(t)
	clientset := kubernetes.NewForConfigOrDie(config)
	namespace := tiertest.Namespace(t, clientset)
	// The dispatchers review a token again after a second (two minutes by default), so a
	// revoked one is refused at once.
	tier := tiertest.StartWith(t, namespace, 2, tiertest.Options{Secure: true, Env: []string{"KD_TOKEN_CACHE_TTL=1s"}})
	s := &scene{config: config, clientset: clientset, tier: tier, objects: 10}
	create(t, clientset, namespace, s.objects)

	first, revokeFirst := boundToken(t, clientset)
	second, _ := boundToken(t, clientset)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken(t, tokenFile, first)
	credentials := dispatch.TLSCredentials(filepath.Join(tiertest.ClusterDir(), "pki", "ca.crt")).WithTokenFile(tokenFile)
	log := newLog()
	replica(t, config, tier, "go-secure", "go-0", log, 0, func(s *setup) {
		s.options.Credentials = &credentials
	})
	s.converged(t)

	writeToken(t, tokenFile, second)
	revokeFirst()
	deadline := time.Now().Add(30 * time.Second)
	for authenticated(t, clientset, first) {
		if time.Now().After(deadline) {
			t.Fatal("the API server still accepts the first token 30 s after its Secret was deleted")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Past the dispatchers' review cache: wait until a call with the first token is refused.
	refused(t, tier.Dispatchers[0].Listen, first)
	s.changeAll(t, 1, nil)
	s.converged(t)
	if overlaps := log.overlapsNow(); len(overlaps) > 0 {
		t.Fatalf("reconciles of one key overlapped: %v", overlaps)
	}
}
