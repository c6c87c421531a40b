package gcs

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/api/googleapi"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// classify: what a GCS error says of the store, kept through RequestFailed.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err   error
		class error
	}{
		{&googleapi.Error{Code: 403, Message: "denied"}, source.ErrDenied},
		{&googleapi.Error{Code: 401}, source.ErrDenied},
		{&googleapi.Error{Code: 503}, source.ErrUnavailable},
		{&googleapi.Error{Code: 400}, nil},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, source.ErrUnavailable},
		{errors.New("something else"), nil},
	} {
		err := objstore.RequestFailed(classify(tc.err))
		assert.Equal(t, tc.class == source.ErrDenied, errors.Is(err, source.ErrDenied), "%v", tc.err)
		assert.Equal(t, tc.class == source.ErrUnavailable, source.IsUnavailable(err), "%v", tc.err)
	}
}
