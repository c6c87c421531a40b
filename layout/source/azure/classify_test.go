package azure

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/stretchr/testify/assert"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// brief marks what an Azure error says of the store, kept through
// RequestFailed.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err   error
		class error
	}{
		{&azcore.ResponseError{StatusCode: 403, ErrorCode: "AuthorizationFailure"}, source.ErrDenied},
		{&azcore.ResponseError{StatusCode: 401}, source.ErrDenied},
		{&azcore.ResponseError{StatusCode: 503}, source.ErrUnavailable},
		{&azcore.ResponseError{StatusCode: 409}, nil},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, source.ErrUnavailable},
		{errors.New("something else"), nil},
	} {
		err := objstore.RequestFailed(brief(tc.err))
		assert.Equal(t, tc.class == source.ErrDenied, errors.Is(err, source.ErrDenied), "%v", tc.err)
		assert.Equal(t, tc.class == source.ErrUnavailable, source.IsUnavailable(err), "%v", tc.err)
	}
}
