package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source/s3"
	"github.com/ckptfs/ckptfs/layout/source/s3/s3test"
)

// TestMinRate: --min-rate and -o min_rate= set the store's MinRate (the
// per-attempt total deadline), whose default is the store's; a local source
// refuses it.
func TestMinRate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, s3.DefaultMinRate},
		{[]string{"--min-rate", "1MiB"}, 1 << 20},
		{[]string{"-o", "min_rate=64KiB"}, 64 << 10},
	} {
		var f mountFlags
		flags := pflag.NewFlagSet("mount", pflag.ContinueOnError)
		f.register(flags)
		require.NoError(t, flags.Parse(tc.args))
		_, err := applyOptions(flags, f.options)
		require.NoError(t, err)
		require.Equal(t, tc.want, f.source.options(0).S3.MinRate, tc.args)
	}
	code, _, errs := runCLI("mount", "--min-rate", "1MiB", sample, t.TempDir())
	require.Equal(t, 2, code)
	require.Contains(t, errs, "--min-rate is for object store sources")
	for _, args := range [][]string{{"--fetch-ahead=false"}, {"-o", "fetch_ahead=false"}} {
		code, _, errs = runCLI(append(append([]string{"mount"}, args...), sample, t.TempDir())...)
		require.Equal(t, 2, code, args)
		require.Contains(t, errs, "--fetch-ahead is for object store sources", args)
	}
}

// TestAuthOptions: --region, --profile, --no-sign-request, --requester-pays
// and their -o forms reach the store's options; a local source refuses
// them.
func TestAuthOptions(t *testing.T) {
	want := s3.Options{Region: "eu-west-3", Profile: "training", NoSignRequest: true, RequesterPays: true}
	for _, args := range [][]string{
		{"--region", "eu-west-3", "--profile", "training", "--no-sign-request", "--requester-pays"},
		{"-o", "region=eu-west-3,profile=training,no_sign_request,requester-pays"},
	} {
		var f mountFlags
		flags := pflag.NewFlagSet("mount", pflag.ContinueOnError)
		f.register(flags)
		require.NoError(t, flags.Parse(args))
		_, err := applyOptions(flags, f.options)
		require.NoError(t, err)
		got := f.source.options(0).S3
		assert.Equal(t, want, s3.Options{Region: got.Region, Profile: got.Profile, NoSignRequest: got.NoSignRequest, RequesterPays: got.RequesterPays}, args)
	}
	for _, flag := range []string{"--no-sign-request", "--requester-pays", "--region=x", "--profile=x"} {
		code, _, errs := runCLI("inspect", flag, sample)
		require.Equal(t, 2, code, flag)
		require.Contains(t, errs, "is for object store sources", flag)
	}
	// An S3 flag for another store, an Azure one for S3, would do nothing
	// too.
	for _, args := range [][]string{{"--region=x", "gs://bucket/ckpt"}, {"--requester-pays", "az://container/ckpt"}, {"--account=x", "s3://bucket/ckpt"}} {
		code, _, errs := runCLI(append([]string{"inspect"}, args...)...)
		require.Equal(t, 2, code, args)
		require.Contains(t, errs, "sources, not", args)
	}
}

// TestInspectPublicBucket: with no credentials anywhere, inspect of a public
// bucket on a real gateway fails in one line that points at
// --no-sign-request, and succeeds with it.
func TestInspectPublicBucket(t *testing.T) {
	g := s3test.StartGateway(t, s3test.GatewayOptions{})
	g.Bucket(t, "public")
	g.Upload(t, "public", "ckpt", filepath.Join(sample, "ckpt"))
	g.PublicRead(t, "public")
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"} {
		t.Setenv(k, "")
	}
	code, _, errs := runCLI("inspect", "s3://public/ckpt")
	require.Equal(t, 1, code, errs)
	assert.Equal(t, 1, strings.Count(errs, "\n"), errs)
	assert.Contains(t, errs, "no credentials found")
	assert.Contains(t, errs, "--no-sign-request")

	code, out, errs := runCLI("inspect", "--no-sign-request", "s3://public/ckpt")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "safetensors")
}
