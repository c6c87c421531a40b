package s3test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/layout/source/objstore/objstoretest"
)

// Root credentials of a gateway started by StartGateway.
const (
	GatewayAccessKey = "ckptfs-root"
	GatewaySecretKey = "ckptfs-root-secret"
)

// GatewayBinary finds versitygw, a real S3 gateway written in Go (a posix
// directory served as buckets, with signature checks, bucket policies and
// anonymous access): $CKPTFS_VERSITYGW, else .tools/bin/versitygw of the
// module (make installs it there), as objstoretest.Tool finds it.
func GatewayBinary(t testing.TB) string {
	t.Helper()
	return objstoretest.Tool(t, "CKPTFS_VERSITYGW", "bin/versitygw")
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
func StartGateway(t testing.TB, o GatewayOptions) *Server {
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
func (s *Server) start(t testing.TB, bin string) {
	t.Helper()
	port := objstoretest.FreePort(t)
	cmd := exec.Command(bin, "--access", GatewayAccessKey, "--secret", GatewaySecretKey, "--region", s.region,
		"--port", fmt.Sprintf("127.0.0.1:%d", port), "--quiet", "posix", s.dir)
	s.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", port)
	s.proc = objstoretest.Serve(t, "versitygw", cmd, s.Endpoint+"/")
}

// Kill stops the gateway for good (connections are then refused).
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.proc.Kill(t)
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
