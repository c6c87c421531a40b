package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/layout/source/azure"
	"github.com/ckptfs/ckptfs/layout/source/gcs"
	"github.com/ckptfs/ckptfs/layout/source/objstore"
	"github.com/ckptfs/ckptfs/layout/source/open"
	"github.com/ckptfs/ckptfs/layout/source/s3"
)

// Defaults for an s3:// source, whose every block is a request with tens of
// milliseconds of latency: larger blocks, more of them in flight.
const (
	s3BlockSize = 16 << 20 // faster than 8 MiB against a boto3 download (BENCHMARKS.md, s3://)
	s3Prefetch  = 8
	s3Workers   = 8
)

// s3CacheDefaults fits the s3 defaults to a block cache of cacheSize bytes.
// The cache keeps a quarter of its blocks as the staging ring and a quarter
// for fills; read-ahead workers leave ristretto at least another quarter.
// The staging ring keeps each block read ahead until it is read, and
// read-ahead runs only as far ahead as the ring can keep (BENCHMARKS.md,
// s3://, and the cache's package doc). Fewer blocks in flight cost less
// than smaller blocks (more requests): only a cache under 8 blocks gets 8 MiB
// ones.
// A blockSize given (not 0) is kept.
func s3CacheDefaults(cacheSize, blockSize int64) (block int64, prefetch, workers int) {
	if blockSize == 0 {
		blockSize = s3BlockSize
		if cacheSize < 8*s3BlockSize {
			blockSize = s3BlockSize / 2
		}
	}
	n := int(cacheSize / blockSize)
	workers = max(1, min(s3Workers, n/4))
	return blockSize, min(s3Prefetch, workers), workers
}

// sourceFlags say how an object store source (s3://, gs://, az://) is
// reached (mount, inspect, export).
type sourceFlags struct {
	endpoint      string
	account       string
	pathStyle     bool
	region        string
	profile       string
	noSignRequest bool
	requesterPays bool
	maxAttempts   int
	readTimeout   time.Duration
	minRate       *byteSize // per second
	cacheDir      string
	cacheDirSize  *byteSize
	flags         *pflag.FlagSet // tells a flag given from its default
	// observeRequest times the store's requests (--metrics-addr).
	observeRequest func(op string, took time.Duration, err error)
}

// register adds the flags; withCache adds --cache-dir (commands that read
// tensor bytes).
func (s *sourceFlags) register(fs *pflag.FlagSet, withCache bool) {
	s.flags = fs
	fs.StringVar(&s.endpoint, "endpoint", "", "object store sources: `URL` of an S3-compatible store (default: $AWS_ENDPOINT_URL, else AWS), of the GCS JSON API (default: $STORAGE_EMULATOR_HOST, else Google's) or of an Azure account's blob service (default: https://ACCOUNT.blob.core.windows.net)")
	fs.StringVar(&s.account, "account", "", "az:// sources: `NAME` of the storage account (default: $AZURE_STORAGE_ACCOUNT, or the one of $AZURE_STORAGE_CONNECTION_STRING)")
	fs.BoolVar(&s.pathStyle, "path-style", false, "s3:// sources: address buckets as ENDPOINT/BUCKET, not BUCKET.ENDPOINT (on unless given =false when an endpoint is set)")
	fs.StringVar(&s.region, "region", "", "s3:// sources: `REGION` to sign requests for (default: $AWS_REGION, the profile's, else us-east-1)")
	fs.StringVar(&s.profile, "profile", "", "s3:// sources: `NAME` of the profile in the AWS config and credentials files (default: $AWS_PROFILE, else default)")
	fs.BoolVar(&s.noSignRequest, "no-sign-request", false, "object store sources: send requests without credentials (public buckets and containers)")
	fs.BoolVar(&s.requesterPays, "requester-pays", false, "s3:// sources: send x-amz-request-payer: requester, so that a requester-pays bucket bills your account")
	fs.IntVar(&s.maxAttempts, "max-attempts", s3.DefaultMaxAttempts, "object store sources: attempts per request, retried with backoff on throttling, 5xx and cut connections")
	fs.DurationVar(&s.readTimeout, "read-timeout", s3.DefaultReadTimeout, "object store sources: fail an attempt whose connection delivers nothing for this long (then retried)")
	s.minRate = newByteSize(s3.DefaultMinRate, false)
	fs.Var(s.minRate, "min-rate", "object store sources: slowest transfer, in `BYTES` per second: an attempt fails (and is retried) after --read-timeout plus its bytes at this rate, so a store that trickles cannot hold a read forever")
	if withCache {
		s.cacheDirSize = newByteSize(10<<30, false)
		fs.StringVar(&s.cacheDir, "cache-dir", "", "object store sources: keep fetched blocks in `DIR` on local disk, so a restart does not fetch them again")
		fs.Var(s.cacheDirSize, "cache-dir-size", "bound on the bytes kept in --cache-dir")
	}
}

func (s *sourceFlags) changed(name string) bool { return s.flags != nil && s.flags.Changed(name) }

// check refuses object store flags for a local source, where they would
// silently do nothing.
func (s *sourceFlags) check(src string) error {
	if open.IsRemote(src) {
		// Flags of one store given for another would do nothing as well.
		for _, store := range []struct {
			is    func(string) bool
			what  string
			names []string
		}{
			{s3.IsURL, "s3://", []string{"path-style", "region", "profile", "requester-pays"}},
			{azure.IsURL, "az://", []string{"account"}},
		} {
			for _, name := range store.names {
				if !store.is(src) && s.changed(name) {
					return &usageError{fmt.Errorf("--%s is for %s sources, not %s", name, store.what, src)}
				}
			}
		}
		return nil
	}
	for _, name := range []string{"endpoint", "account", "path-style", "region", "profile", "no-sign-request", "requester-pays", "max-attempts", "read-timeout", "min-rate", "cache-dir", "cache-dir-size"} {
		if s.changed(name) {
			return &usageError{fmt.Errorf("--%s is for object store sources (s3://, gs://, az://); %s is a local directory", name, src)}
		}
	}
	return nil
}

// options are the open.Options the flags give, with a disk cache of blocks
// of blockSize.
func (s *sourceFlags) options(blockSize int64) open.Options {
	s3o := s.s3Options()
	limits := objstore.Limits{MaxAttempts: s3o.MaxAttempts, ReadTimeout: s3o.ReadTimeout, MinRate: s3o.MinRate,
		ObserveRequest: s3o.ObserveRequest}
	o := open.Options{S3: s3o, CacheDir: s.cacheDir, BlockSize: blockSize,
		GCS:   gcs.Options{Limits: limits, Endpoint: s.endpoint, Anonymous: s.noSignRequest},
		Azure: azure.Options{Limits: limits, Account: s.account, Endpoint: s.endpoint, Anonymous: s.noSignRequest}}
	if s.cacheDirSize != nil { // a command with --cache-dir
		o.CacheDirSize = s.cacheDirSize.Int64()
	}
	return o
}

// s3Options are the store's options as the flags give them.
func (s *sourceFlags) s3Options() s3.Options {
	o := s3.Options{Endpoint: s.endpoint, Region: s.region, Profile: s.profile, NoSignRequest: s.noSignRequest,
		RequesterPays: s.requesterPays, MaxAttempts: s.maxAttempts, ReadTimeout: s.readTimeout, MinRate: s.minRate.Int64(),
		ObserveRequest: s.observeRequest}
	if s.changed("path-style") {
		o.PathStyle = &s.pathStyle
	}
	return o
}
