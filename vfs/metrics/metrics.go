// Package metrics exports the counters of a ckptfs mount to Prometheus.
//
// Counters and gauges are read at scrape time from the snapshot that the
// .ckptfs file shows (vfs.FS.Stats), so the endpoint and the file never
// disagree and nothing is counted twice. Only the latency histograms are fed
// as events happen, through the observer hooks of the cache (fills) and the
// vfs (commits); each observes every attempt, failed ones included, so a
// histogram's _count settles at the matching counters once nothing is in
// flight.
package metrics

import (
	"net/http"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/vfs"
)

const namespace = "ckptfs"

// Metrics is the registry of one mount.
type Metrics struct {
	reg            *prometheus.Registry
	fillSeconds    prometheus.Histogram
	commitSeconds  prometheus.Histogram
	opSeconds      *prometheus.HistogramVec
	opErrors       *prometheus.CounterVec
	requestSeconds *prometheus.HistogramVec
}

// New returns a registry holding the latency histograms and the Go runtime
// and process collectors (RSS is the number to watch against --cache-size).
// Call Watch once the mount's state exists.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		fillSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "cache", Name: "fill_duration_seconds",
			Help: "Time to read one cache block from its source (foreground and read-ahead fills, failed ones included).",
			// 100 µs (page cache) to ~28 min: past the longest a fill may
			// take to fail (an s3:// block's retry budget, ~8 min by default).
			Buckets: prometheus.ExponentialBuckets(100e-6, 4, 13),
		}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "commit_duration_seconds",
			Help: "Time to commit a file closed in a write target into DCP shards (failed commits included).",
			// 10 ms to ~11 min: a reshard is bounded by disk bandwidth.
			Buckets: prometheus.ExponentialBuckets(10e-3, 4, 9),
		}),
		opSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "fuse", Name: "op_duration_seconds",
			Help: "Time to answer one FUSE request, by op (lookup, getattr, open, read, release, opendir, readdir, readdirplus, write, flush); failed ones included. Its _count is the requests.",
			// 10 µs (a cached getattr) to ~11 min: past the longest a
			// request may wait on a store that does not answer (a read's
			// deadline, a block's retry budget: ~8 min by default).
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 14),
		}, []string{"op"}),
		opErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "fuse", Name: "op_errors_total",
			Help: "FUSE requests answered with an error, by op and errno name (EIO, ENOENT, ...).",
		}, []string{"op", "errno"}),
		requestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "source", Name: "request_duration_seconds",
			Help: "Time of one attempt of an object store request, from sending it to its response's headers, by operation (GetObject, HeadObject, ListObjectsV2); failed attempts included.",
			// 1 ms to ~17 min: past the longest an attempt may take (its
			// deadline: --read-timeout plus the bytes at --min-rate).
			Buckets: prometheus.ExponentialBuckets(1e-3, 4, 11),
		}, []string{"op"}),
	}
	m.reg.MustRegister(m.fillSeconds, m.commitSeconds, m.opSeconds, m.opErrors, m.requestSeconds,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveFill is a cache.Options.FillObserver.
func (m *Metrics) ObserveFill(took time.Duration, _ error) { m.fillSeconds.Observe(took.Seconds()) }

// ObserveCommit is a vfs.Options.CommitObserver.
func (m *Metrics) ObserveCommit(took time.Duration, _ error) { m.commitSeconds.Observe(took.Seconds()) }

// ObserveOp is a vfs.MountOptions.ObserveOp.
func (m *Metrics) ObserveOp(op string, took time.Duration, errno syscall.Errno) {
	m.opSeconds.WithLabelValues(op).Observe(took.Seconds())
	if errno != 0 {
		m.opErrors.WithLabelValues(op, errnoName(errno)).Inc()
	}
}

// errnoName is the errno's symbol (EIO), the label Prometheus users filter on.
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return strconv.Itoa(int(e))
}

// ObserveRequest is an s3.Options.ObserveRequest.
func (m *Metrics) ObserveRequest(op string, took time.Duration, _ error) {
	m.requestSeconds.WithLabelValues(op).Observe(took.Seconds())
}

// Build exports ckptfs_build_info{version,commit,goversion} 1, as
// gcsfuse and mountpoint-s3 do: which binary serves the mount.
func (m *Metrics) Build(version, commit string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "The version, commit and Go version of the ckptfs binary serving the mount (always 1).",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "goversion": runtime.Version()},
	})
	g.Set(1)
	m.reg.MustRegister(g)
}

// Watch registers the counters read from snapshot at every scrape.
func (m *Metrics) Watch(snapshot func() vfs.Stats) {
	m.reg.MustRegister(&statsCollector{snapshot: snapshot})
}

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// stat is one exported value of a snapshot.
type stat struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(s *vfs.Stats) int64
	label string // the constant label value of desc's one variable label, if any
}

func newDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
}

var errorsDesc = newDesc("errors_total", "Failures by kind: read (a read returned an error to the caller), fill (a cache block could not be read from its source), lookup (a lookup, stat or listing answered EIO or EACCES because the source failed; a missing name is none), commit (a written file could not be resharded), source (an object store request that failed after its retries).", "kind")

// sourceIO reads a field of the remote source's counters; 0 for a local
// source.
func sourceIO(field func(s *source.Stats) int64) func(s *vfs.Stats) int64 {
	return func(s *vfs.Stats) int64 {
		if s.SourceIO == nil {
			return 0
		}
		return field(s.SourceIO)
	}
}

// stats lists every value of vfs.Stats the endpoint exports, with the name
// of the .ckptfs field it comes from in its help.
var stats = []stat{
	{newDesc("bytes_served_total", "Bytes returned to readers of view files (.ckptfs bytes_served)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.BytesServed }, ""},
	{newDesc("prefilled_bytes_total", "Bytes --prefill stored in the kernel's page cache (.ckptfs prefilled_bytes)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.PrefilledBytes }, ""},
	{newDesc("pass_bytes_served_total", "Bytes of other files that ckptfs read for their readers; 0 where the kernel reads them itself (FUSE passthrough) (.ckptfs pass_bytes_served)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.PassBytesServed }, ""},
	{errorsDesc, prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.ReadErrors }, "read"},
	{errorsDesc, prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.FillErrors }, "fill"},
	{errorsDesc, prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.LookupErrors }, "lookup"},
	{errorsDesc, prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.CommitErrors }, "commit"},
	{errorsDesc, prometheus.CounterValue, sourceIO(func(s *source.Stats) int64 { return s.Errors }), "source"},
	{newDesc("source_requests_total", "Requests sent to an object store source, retries included (.ckptfs source_io.requests)."), prometheus.CounterValue, sourceIO(func(s *source.Stats) int64 { return s.Requests }), ""},
	{newDesc("source_fetched_bytes_total", "Bytes received from an object store source (.ckptfs source_io.bytes_fetched)."), prometheus.CounterValue, sourceIO(func(s *source.Stats) int64 { return s.BytesFetched }), ""},
	{newDesc("source_retries_total", "Requests to an object store sent again after throttling, a 5xx or a cut connection (.ckptfs source_io.retries)."), prometheus.CounterValue, sourceIO(func(s *source.Stats) int64 { return s.Retries }), ""},
	{newDesc("disk_cache_hits_total", "Blocks read from the --cache-dir disk cache (.ckptfs source_io.disk_hits)."), prometheus.CounterValue, sourceIO(func(s *source.Stats) int64 { return s.DiskHits }), ""},
	{newDesc("disk_cache_misses_total", "Blocks fetched because the disk cache lacked them (.ckptfs source_io.disk_misses)."), prometheus.CounterValue, sourceIO(func(s *source.Stats) int64 { return s.DiskMisses }), ""},
	{newDesc("disk_cache_bytes", "Bytes held by the disk cache now (.ckptfs source_io.disk_bytes)."), prometheus.GaugeValue, sourceIO(func(s *source.Stats) int64 { return s.DiskBytes }), ""},
	{newDesc("disk_cache_errors_total", "Disk cache blocks found corrupt or not written; served from the source instead (.ckptfs source_io.disk_errors)."), prometheus.CounterValue, sourceIO(func(s *source.Stats) int64 { return s.DiskErrors }), ""},
	{newDesc("commits_total", "Files closed in write targets and committed into DCP shards (.ckptfs commits)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Commits }, ""},
	{newDesc("open_handles", "Open view file handles (.ckptfs cache.open_handles)."), prometheus.GaugeValue, func(s *vfs.Stats) int64 { return s.Cache.OpenHandles }, ""},
	{newDesc("cache_hits_total", "Block lookups served from the cache (.ckptfs cache.hits)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.Hits }, ""},
	{newDesc("cache_staging_hits_total", "Of the hits, blocks found only among the recently filled ones (.ckptfs cache.staging_hits)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.StagingHits }, ""},
	{newDesc("cache_misses_total", "Block lookups that filled or joined a fill (.ckptfs cache.misses)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.Misses }, ""},
	{newDesc("cache_fills_total", "Blocks read from their source, foreground and read-ahead (.ckptfs cache.fills)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.Fills }, ""},
	{newDesc("cache_admissions_total", "Blocks admitted into the cache (.ckptfs cache.keys_added)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.KeysAdded }, ""},
	{newDesc("cache_evictions_total", "Blocks evicted from the cache (.ckptfs cache.keys_evicted)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.KeysEvicted }, ""},
	{newDesc("cache_staging_spilled_total", "Blocks the staging ring gave up to make room for a fill, to ristretto unless read in full (.ckptfs cache.staging_spilled)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.StagingSpilled }, ""},
	{newDesc("cache_sets_rejected_total", "Blocks the cache's admission policy refused (.ckptfs cache.sets_rejected)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.SetsRejected }, ""},
	{newDesc("cache_sets_dropped_total", "Blocks dropped because the cache's set buffer was full (.ckptfs cache.sets_dropped)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.SetsDropped }, ""},
	{newDesc("cache_bytes", "Bytes of blocks held in ristretto now (.ckptfs cache.cached_bytes)."), prometheus.GaugeValue, func(s *vfs.Stats) int64 { return s.Cache.CachedBytes }, ""},
	{newDesc("cache_staged_bytes", "Bytes of the most recently filled or used blocks, in the staging ring (.ckptfs cache.staged_bytes)."), prometheus.GaugeValue, func(s *vfs.Stats) int64 { return s.Cache.StagedBytes }, ""},
	{newDesc("cache_filling_bytes", "Bytes of the blocks being read from their sources now (.ckptfs cache.filling_bytes)."), prometheus.GaugeValue, func(s *vfs.Stats) int64 { return s.Cache.FillingBytes }, ""},
	{newDesc("cache_free_bytes", "Bytes of block buffers kept for the next fills (.ckptfs cache.free_bytes)."), prometheus.GaugeValue, func(s *vfs.Stats) int64 { return s.Cache.FreeBytes }, ""},
	{newDesc("cache_buffers_reused_total", "Fills into a kept block buffer instead of a fresh one (.ckptfs cache.buffers_reused)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.BuffersReused }, ""},
	{newDesc("read_ahead_issued_total", "Blocks queued for read-ahead (.ckptfs cache.read_ahead_issued)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.ReadAheadIssued }, ""},
	{newDesc("read_ahead_hits_total", "Read-ahead blocks later used by a read (.ckptfs cache.read_ahead_hits)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.ReadAheadHits }, ""},
	{newDesc("metadata_bytes", "Resident metadata of the open views (.ckptfs metadata_bytes), within --metadata-budget."), prometheus.GaugeValue, func(s *vfs.Stats) int64 { return s.MetadataBytes }, ""},
	{newDesc("metadata_budget_bytes", "The metadata budget (.ckptfs metadata_budget): views are closed beyond it."), prometheus.GaugeValue, func(s *vfs.Stats) int64 { return s.MetadataBudget }, ""},
	{newDesc("read_ahead_dropped_total", "Read-ahead blocks dropped because the queue or the foreground was busy (.ckptfs cache.read_ahead_dropped)."), prometheus.CounterValue, func(s *vfs.Stats) int64 { return s.Cache.ReadAheadDropped }, ""},
}

var viewsDesc = newDesc("views", "Checkpoint directories opened by the mount, by state: ok, error (shown as CKPTFS_ERROR.txt), writing (write targets).", "state")

// statsCollector turns one snapshot per scrape into metrics.
type statsCollector struct {
	snapshot func() vfs.Stats
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	seen := map[*prometheus.Desc]bool{}
	for _, s := range stats {
		if !seen[s.desc] {
			seen[s.desc] = true
			ch <- s.desc
		}
	}
	ch <- viewsDesc
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.snapshot()
	for _, s := range stats {
		var labels []string
		if s.label != "" {
			labels = []string{s.label}
		}
		ch <- prometheus.MustNewConstMetric(s.desc, s.kind, float64(s.value(&snap)), labels...)
	}
	views := map[string]int{"ok": 0, "error": 0, "writing": 0}
	for _, v := range snap.Views {
		switch {
		case v.Writing:
			views["writing"]++
		case v.Error != "":
			views["error"]++
		default:
			views["ok"]++
		}
	}
	for state, n := range views {
		ch <- prometheus.MustNewConstMetric(viewsDesc, prometheus.GaugeValue, float64(n), state)
	}
}
