package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/layout/source/open"
)

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
	fs.IntVar(&s.maxAttempts, "max-attempts", open.DefaultMaxAttempts, "object store sources: attempts per request, retried with backoff on throttling, 5xx and cut connections")
	fs.DurationVar(&s.readTimeout, "read-timeout", open.DefaultReadTimeout, "object store sources: fail an attempt whose connection delivers nothing for this long (then retried)")
	s.minRate = newByteSize(open.DefaultMinRate, false)
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
			scheme string
			names  []string
		}{
			{"s3://", []string{"path-style", "region", "profile", "requester-pays"}},
			{"az://", []string{"account"}},
		} {
			for _, name := range store.names {
				if open.Scheme(src) != store.scheme && s.changed(name) {
					return &usageError{fmt.Errorf("--%s is for %s sources, not %s", name, store.scheme, src)}
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
	limits := s.limits()
	o := open.Options{CacheDir: s.cacheDir, BlockSize: blockSize}
	o.GCS.Limits, o.GCS.Endpoint, o.GCS.Anonymous = limits, s.endpoint, s.noSignRequest
	o.Azure.Limits, o.Azure.Account, o.Azure.Endpoint, o.Azure.Anonymous = limits, s.account, s.endpoint, s.noSignRequest
	o.S3.Endpoint, o.S3.Region, o.S3.Profile = s.endpoint, s.region, s.profile
	o.S3.NoSignRequest, o.S3.RequesterPays = s.noSignRequest, s.requesterPays
	o.S3.MaxAttempts, o.S3.ReadTimeout, o.S3.MinRate = limits.MaxAttempts, limits.ReadTimeout, limits.MinRate
	o.S3.ObserveRequest = limits.ObserveRequest
	o.S3.MinRequest, o.S3.AheadMemory = limits.MinRequest, limits.AheadMemory
	if s.changed("path-style") {
		o.S3.PathStyle = &s.pathStyle
	}
	if s.cacheDirSize != nil { // a command with --cache-dir
		o.CacheDirSize = s.cacheDirSize.Int64()
	}
	return o
}

// limits bound the store's requests, as the flags give them.
func (s *sourceFlags) limits() open.Limits {
	return open.Limits{MaxAttempts: s.maxAttempts, ReadTimeout: s.readTimeout, MinRate: s.minRate.Int64(),
		ObserveRequest: s.observeRequest}
}
