package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/cache"
	"github.com/ckptfs/ckptfs/layout/source/s3"
	"github.com/ckptfs/ckptfs/vfs"
)

// notExported are the numeric .ckptfs fields the endpoint leaves out, and why.
var notExported = map[string]string{
	"cache.BytesServed": "the same bytes as bytes_served: view files are served only through the cache",
}

// distinctStats sets every int64 field of a vfs.Stats (cache included) to a
// different value, so that each exported number can be traced to its field.
func distinctStats() (vfs.Stats, map[string]int64) {
	var s vfs.Stats
	values := map[string]int64{}
	next := int64(1000)
	var fill func(prefix string, v reflect.Value)
	fill = func(prefix string, v reflect.Value) {
		for i := range v.NumField() {
			f, name := v.Field(i), prefix+v.Type().Field(i).Name
			switch f.Kind() {
			case reflect.Int64:
				next += 7
				f.SetInt(next)
				values[name] = next
			case reflect.Struct:
				fill(prefix+strings.ToLower(v.Type().Field(i).Name)+".", f)
			case reflect.Pointer:
				if f.Type().Elem().Kind() == reflect.Struct {
					f.Set(reflect.New(f.Type().Elem()))
					fill(prefix+strings.ToLower(v.Type().Field(i).Name)+".", f.Elem())
				}
			}
		}
	}
	fill("", reflect.ValueOf(&s).Elem())
	s.Views = []vfs.ViewStats{{Dir: "a"}, {Dir: "b"}, {Dir: "c", Error: "bad"}, {Dir: "d", Writing: true}}
	return s, values
}

func scrape(t *testing.T, m *Metrics) string {
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// TestEveryCounterIsExported: each numeric field of the .ckptfs snapshot
// appears on the endpoint with its value, so a counter added to the file
// without a metric fails here.
func TestEveryCounterIsExported(t *testing.T) {
	snap, values := distinctStats()
	m := New()
	m.Watch(func() vfs.Stats { return snap })
	body := scrape(t, m)
	for field, v := range values {
		if why, ok := notExported[field]; ok {
			require.NotEmpty(t, why)
			continue
		}
		require.Regexp(t, `(?m)^ckptfs_\S+ `+strconv.FormatInt(v, 10)+`$`, body, "%s (%d) is not exported", field, v)
	}
}

func TestValuesAndNames(t *testing.T) {
	snap, _ := distinctStats()
	m := New()
	m.Watch(func() vfs.Stats { return snap })
	body := scrape(t, m)
	for _, want := range []string{
		"ckptfs_bytes_served_total " + strconv.FormatInt(snap.BytesServed, 10),
		`ckptfs_errors_total{kind="read"} ` + strconv.FormatInt(snap.ReadErrors, 10),
		`ckptfs_errors_total{kind="fill"} ` + strconv.FormatInt(snap.Cache.FillErrors, 10),
		`ckptfs_errors_total{kind="lookup"} ` + strconv.FormatInt(snap.LookupErrors, 10),
		`ckptfs_errors_total{kind="commit"} ` + strconv.FormatInt(snap.CommitErrors, 10),
		`ckptfs_errors_total{kind="source"} ` + strconv.FormatInt(snap.SourceIO.Errors, 10),
		"ckptfs_source_requests_total " + strconv.FormatInt(snap.SourceIO.Requests, 10),
		"ckptfs_source_retries_total " + strconv.FormatInt(snap.SourceIO.Retries, 10),
		"ckptfs_cache_evictions_total " + strconv.FormatInt(snap.Cache.KeysEvicted, 10),
		"ckptfs_open_handles " + strconv.FormatInt(snap.Cache.OpenHandles, 10),
		`ckptfs_views{state="ok"} 2`, `ckptfs_views{state="error"} 1`, `ckptfs_views{state="writing"} 1`,
		"process_resident_memory_bytes ",
	} {
		require.Contains(t, body, want)
	}
	problems, err := testutil.GatherAndLint(m.reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// TestLocalSource: a local source has no traffic to count; its metrics
// are 0, not absent, so that dashboards work for both.
func TestLocalSource(t *testing.T) {
	m := New()
	m.Watch(func() vfs.Stats { return vfs.Stats{} })
	body := scrape(t, m)
	require.Contains(t, body, "ckptfs_source_requests_total 0\n")
	require.Contains(t, body, `ckptfs_errors_total{kind="source"} 0`+"\n")
}

// TestSnapshotPerScrape: values are read when scraped, not when registered.
func TestSnapshotPerScrape(t *testing.T) {
	var served int64
	m := New()
	m.Watch(func() vfs.Stats { return vfs.Stats{BytesServed: served} })
	require.Contains(t, scrape(t, m), "ckptfs_bytes_served_total 0\n")
	served = 12345
	require.Contains(t, scrape(t, m), "ckptfs_bytes_served_total 12345\n")
}

func TestHistograms(t *testing.T) {
	m := New()
	m.Watch(func() vfs.Stats { return vfs.Stats{Cache: cache.Stats{}} })
	m.ObserveFill(300*time.Microsecond, nil)
	m.ObserveFill(2*time.Second, errors.New("source gone"))
	m.ObserveCommit(50*time.Millisecond, nil)
	body := scrape(t, m)
	require.Contains(t, body, "ckptfs_cache_fill_duration_seconds_count 2\n")
	require.Contains(t, body, `ckptfs_cache_fill_duration_seconds_bucket{le="0.0004"} 1`+"\n")
	require.Contains(t, body, "ckptfs_commit_duration_seconds_count 1\n")
	require.Contains(t, body, `ckptfs_commit_duration_seconds_bucket{le="0.04"} 0`+"\n")
	require.Contains(t, body, `ckptfs_commit_duration_seconds_bucket{le="0.16"} 1`+"\n")
}

// TestBucketsReachTheLongestBound: every latency histogram has a bucket
// past the longest its requests may take to fail against an object store
// that does not answer (a 16 MiB block's retry budget with the default
// --read-timeout and --max-attempts), so that an outage is not all in +Inf
// (issue 34.7: the op histogram stopped at 10.5 s).
func TestBucketsReachTheLongestBound(t *testing.T) {
	m := New()
	m.ObserveFill(time.Millisecond, nil)
	m.ObserveOp("read", time.Millisecond, 0)
	m.ObserveRequest("GetObject", time.Millisecond, nil)
	bound := s3.Options{}.Budget(16 << 20).Seconds()
	families, err := m.reg.Gather()
	require.NoError(t, err)
	seen := 0
	for _, f := range families {
		for _, metric := range f.Metric {
			h := metric.GetHistogram()
			if h == nil || f.GetName() == "ckptfs_commit_duration_seconds" {
				continue
			}
			b := h.GetBucket()
			require.GreaterOrEqual(t, b[len(b)-1].GetUpperBound(), bound, f.GetName())
			seen++
		}
	}
	require.Equal(t, 3, seen)
}
