package s3test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/internal/testenv"
)

// Root credentials of a gateway started by StartGateway.
const (
	GatewayAccessKey = "ckptfs-root"
	GatewaySecretKey = "ckptfs-root-secret"
)

// GatewayBinary finds versitygw, a real S3 gateway written in Go (a posix
// directory served as buckets, with signature checks, bucket policies and
// anonymous access): $CKPTFS_VERSITYGW, else .tools/bin/versitygw of the
// module (make installs it there). A test without it is skipped, unless
// $CKPTFS_VERSITYGW is set (make test sets it), which makes it fail.
func GatewayBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CKPTFS_VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("CKPTFS_VERSITYGW: %v (make test installs it)", err)
		}
		return p
	}
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, ".tools", "bin", "versitygw")
			_, err := os.Stat(p)
			testenv.RequireSystem(t, err == nil, "versitygw at "+p+" (make tools installs it)")
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("versitygw: no go.mod above the test's directory")
		}
		dir = parent
	}
}

// GatewayOptions configure StartGateway.
type GatewayOptions struct {
	// Region the gateway checks signatures against (default us-east-1).
	Region string
}

// StartGateway starts versitygw on 127.0.0.1 over a temporary directory,
// stopped at the end of the test, and sets the AWS_* environment (its root
// credentials, AWS_ENDPOINT_URL, no config files) as Start does. Signal
// and Kill act on its process.
func StartGateway(t *testing.T, o GatewayOptions) *Server {
	t.Helper()
	bin := GatewayBinary(t)
	if o.Region == "" {
		o.Region = "us-east-1"
	}
	s := &Server{dir: t.TempDir(), region: o.Region}
	s.start(t, bin)
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": GatewayAccessKey, "AWS_SECRET_ACCESS_KEY": GatewaySecretKey, "AWS_REGION": o.Region,
		"AWS_ENDPOINT_URL": s.Endpoint, "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
		"AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	s.Client = awss3.New(awss3.Options{
		BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true, Region: o.Region,
		Credentials: credentials.NewStaticCredentialsProvider(GatewayAccessKey, GatewaySecretKey, ""),
	})
	return s
}

// start runs the gateway on a free port and waits for it to answer.
func (s *Server) start(t *testing.T, bin string) {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(bin, "--access", GatewayAccessKey, "--secret", GatewaySecretKey, "--region", s.region,
		"--port", fmt.Sprintf("127.0.0.1:%d", port), "--quiet", "posix", s.dir)
	s.cmd = cmd
	s.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", port)
	serve(t, "versitygw", cmd, s.Endpoint+"/")
}

// Kill stops the gateway for good (connections are then refused).
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// PublicRead lets anonymous clients list bucket and read its objects (a
// bucket policy with Principal "*", as a public dataset bucket has).
func (s *Server) PublicRead(t testing.TB, bucket string) {
	t.Helper()
	policy := fmt.Sprintf(`{"Statement":[`+
		`{"Effect":"Allow","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::%[1]s"},`+
		`{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::%[1]s/*"}]}`, bucket)
	_, err := s.Client.PutBucketPolicy(context.Background(), &awss3.PutBucketPolicyInput{Bucket: &bucket, Policy: &policy})
	if err != nil {
		t.Fatal(errors.Join(errors.New("put bucket policy"), err))
	}
}
