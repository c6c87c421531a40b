// Package s3 is a source.Tree over an S3 bucket prefix (AWS S3 or an
// S3-compatible store), read with the AWS SDK for Go v2: every format reader
// works on it unchanged.
//
// Keys are confined to the prefix: a name is cleaned as a local path (no
// "..", not absolute) and joined below the prefix, and listed keys that
// could not be named that way ("..", empty segments) are not shown. S3 has
// no symlinks. Directories are the common prefixes of a delimited listing.
// When a key is both an object and a prefix of others, the object wins.
//
// A file is a snapshot of its object's ETag at open (source.Info.Version):
// every read is a ranged GET with If-Match on it, and every response is
// checked against that ETag, the range asked for and the size opened (a
// store may ignore If-Match or Range), so a replaced object fails with
// source.ErrChanged instead of mixing old and new bytes.
//
// Every attempt of a request has a total deadline, not only the idle
// Options.ReadTimeout: ReadTimeout plus its bytes at Options.MinRate
// (defaults: 30 s + 64 s for a 16 MiB ranged GET). An attempt past it is
// retried like a cut connection, so a store that trickles bytes fails a
// read (ErrRequest) after about MaxAttempts deadlines plus the backoff
// between them.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"golang.org/x/sync/singleflight"

	"github.com/ckptfs/ckptfs/layout/source"
)

// Tree is the objects under a bucket prefix, read-only.
type Tree struct {
	loc    Location
	opts   Options
	client *awss3.Client
	count  counters
	opened time.Time // directories have no time of their own: they show this

	// reqs is the context of the requests sent now (requestCtx): canceled
	// by Close for good, and by Drain for the requests then in flight.
	reqs struct {
		sync.Mutex
		ctx      context.Context
		cancel   context.CancelFunc
		closed   bool
		draining bool // no more lookups (lookupCtx)
	}

	windows *windows // small reads
	lists   singleflight.Group
	mu      sync.Mutex
	cache   map[string]listing // GUARDED_BY(mu); by directory name, fresh for ListTTL
}

type listing struct {
	at   time.Time
	ents []source.Info
}

var (
	_ source.Tree    = (*Tree)(nil)
	_ source.Counted = (*Tree)(nil)
)

// Open returns the tree at url (s3://BUCKET[/PREFIX]); ctx bounds loading
// the configuration. It lists the prefix once: a prefix with no objects
// under it is an error, as a missing directory is.
func Open(ctx context.Context, url string, o Options) (*Tree, error) {
	loc, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	t := &Tree{loc: loc, opts: o.withDefaults(), opened: time.Now(), cache: map[string]listing{},
		windows: newWindows()}
	if t.client, err = newClient(ctx, t.opts, &t.count); err != nil {
		return nil, fmt.Errorf("%s: %w", loc, err)
	}
	t.reqs.ctx, t.reqs.cancel = context.WithCancel(context.Background())
	if _, err := t.statDir("."); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Location is the bucket and prefix of the tree.
func (t *Tree) Location() Location { return t.loc }

// Close cancels requests in flight; the tree is not used after.
func (t *Tree) Close() error {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	t.reqs.closed = true
	t.reqs.cancel()
	return nil
}

// Drain ends the requests in flight (they fail with context.Canceled) and
// every Stat, ReadDir and Open from now on, while the files open go on
// being read: a mount being unmounted stops waiting on a stalled store
// (a lookup is several requests) and still serves the files that stay
// open.
func (t *Tree) Drain() {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	if !t.reqs.closed {
		t.reqs.draining = true
		t.reqs.cancel()
		t.reqs.ctx, t.reqs.cancel = context.WithCancel(context.Background())
	}
}

// requestCtx is the context to send a read's attempts with.
func (t *Tree) requestCtx() context.Context {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	return t.reqs.ctx
}

// lookupCtx is the context of a HEAD or LIST: done once draining.
func (t *Tree) lookupCtx() context.Context {
	t.reqs.Lock()
	defer t.reqs.Unlock()
	if t.reqs.draining {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	return t.reqs.ctx
}

// Stats are the tree's requests, bytes fetched, retries and errors.
func (t *Tree) Stats() source.Stats { return t.count.stats() }

// Path is the s3:// URL of name.
func (t *Tree) Path(name string) string {
	if n, err := source.Clean(name); err == nil {
		name = n
	}
	return t.loc.url(name)
}

// Stat describes name: from the listing of its directory when that was
// listed before (listed again once older than ListTTL: one request answers
// for every file of a checkpoint, where checking each would be a HEAD per
// shard at every open), else with a HEAD of its key and, when that finds no
// object, a one-key listing of it as a prefix.
func (t *Tree) Stat(name string) (source.Info, error) {
	name, err := source.Clean(name)
	if err != nil {
		return source.Info{}, err
	}
	if name != "." {
		dir := path.Dir(name)
		if ents, fresh, known := t.cached(dir); known {
			if !fresh {
				if ents, err = t.ReadDir(dir); err != nil {
					return source.Info{}, err
				}
			}
			base := path.Base(name)
			i := sort.Search(len(ents), func(i int) bool { return ents[i].Name >= base })
			if i < len(ents) && ents[i].Name == base {
				return ents[i], nil
			}
			return source.Info{}, t.notExist("stat", name)
		}
		info, err := t.head(name)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return info, err
		}
	}
	return t.statDir(name)
}

// head describes the object at name.
func (t *Tree) head(name string) (source.Info, error) {
	out, err := t.client.HeadObject(t.lookupCtx(), &awss3.HeadObjectInput{Bucket: &t.loc.Bucket, Key: aws.String(t.loc.key(name))})
	if err != nil {
		return source.Info{}, t.fail("stat", name, err)
	}
	return t.fileInfo(name, aws.ToInt64(out.ContentLength), aws.ToTime(out.LastModified), aws.ToString(out.ETag)), nil
}

// statDir describes name as a directory if any key lies under it.
func (t *Tree) statDir(name string) (source.Info, error) {
	out, err := t.client.ListObjectsV2(t.lookupCtx(), &awss3.ListObjectsV2Input{Bucket: &t.loc.Bucket,
		Prefix: aws.String(t.loc.dirPrefix(name)), MaxKeys: aws.Int32(1)})
	if err != nil {
		return source.Info{}, t.fail("stat", name, err)
	}
	if len(out.Contents) == 0 && len(out.CommonPrefixes) == 0 {
		return source.Info{}, t.notExist("stat", name)
	}
	return t.dirInfo(name), nil
}

func (t *Tree) fileInfo(name string, size int64, mtime time.Time, etag string) source.Info {
	return source.Info{Name: path.Base(name), Size: size, ModTime: mtime,
		ID: t.loc.url(name), Version: normalizeETag(etag)}
}

func (t *Tree) dirInfo(name string) source.Info {
	return source.Info{Name: path.Base(name), ModTime: t.opened, Mode: fs.ModeDir, ID: t.loc.url(name) + "/"}
}

// normalizeETag drops the quotes, which HEAD and LIST responses may or may
// not keep, so the Version from either compares equal.
func normalizeETag(etag string) string { return strings.Trim(etag, `"`) }

// ReadDir lists the directory name with a delimited ListObjectsV2: objects
// are files, common prefixes directories. Keys that no tree name could reach
// ("..", ".", empty segments, directory marker objects) are left out.
func (t *Tree) ReadDir(name string) ([]source.Info, error) {
	name, err := source.Clean(name)
	if err != nil {
		return nil, err
	}
	if ents, fresh, _ := t.cached(name); fresh {
		return ents, nil
	}
	v, err, _ := t.lists.Do(name, func() (any, error) { return t.list(name) })
	if err != nil {
		return nil, err
	}
	return v.([]source.Info), nil
}

func (t *Tree) list(name string) ([]source.Info, error) {
	prefix := t.loc.dirPrefix(name)
	byName := map[string]source.Info{}
	p := awss3.NewListObjectsV2Paginator(t.client, &awss3.ListObjectsV2Input{Bucket: &t.loc.Bucket,
		Prefix: aws.String(prefix), Delimiter: aws.String("/")})
	ctx := t.lookupCtx()
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, t.fail("readdir", name, err)
		}
		for _, cp := range page.CommonPrefixes {
			base := strings.TrimSuffix(strings.TrimPrefix(aws.ToString(cp.Prefix), prefix), "/")
			if validBase(base) {
				if _, isFile := byName[base]; !isFile {
					byName[base] = t.dirInfo(path.Join(name, base))
				}
			}
		}
		for _, o := range page.Contents {
			base := strings.TrimPrefix(aws.ToString(o.Key), prefix)
			if validBase(base) {
				byName[base] = t.fileInfo(path.Join(name, base), aws.ToInt64(o.Size), aws.ToTime(o.LastModified), aws.ToString(o.ETag))
			}
		}
	}
	if len(byName) == 0 && name != "." {
		// An empty listing is no directory at all (S3 has no empty ones).
		if _, err := t.statDir(name); err != nil {
			return nil, err
		}
	}
	ents := make([]source.Info, 0, len(byName))
	for _, e := range byName {
		ents = append(ents, e)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.cache) >= maxListings {
		for k := range t.cache { // the map's order: any listing, dropped
			delete(t.cache, k)
			if len(t.cache) < maxListings/2 {
				break
			}
		}
	}
	t.cache[name] = listing{at: time.Now(), ents: ents}
	return ents, nil
}

// maxListings bounds the directory listings a tree keeps.
const maxListings = 4096

// validBase reports whether a listed key's last segment is a name the tree
// can be asked for.
func validBase(base string) bool {
	return base != "" && base != "." && base != ".." && !strings.ContainsAny(base, "/\x00")
}

// cached returns the listing of dir, whether it is fresh, and whether dir
// was listed at all.
func (t *Tree) cached(dir string) (ents []source.Info, fresh, known bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.cache[dir]
	if !ok {
		return nil, false, false
	}
	return l.ents, time.Since(l.at) <= t.opts.ListTTL, true
}

// Open opens the object at name. Its size and ETag come from Stat; nothing
// is fetched until the first read.
func (t *Tree) Open(name string) (source.File, error) {
	name, err := source.Clean(name)
	if err != nil {
		return nil, err
	}
	info, err := t.Stat(name)
	if err != nil {
		return nil, err
	}
	if !info.IsRegular() {
		return nil, fmt.Errorf("%w: %s is a directory (a prefix of objects)", source.ErrNotRegular, t.loc.url(name))
	}
	return &file{t: t, key: t.loc.key(name), url: t.loc.url(name), info: info}, nil
}

// notExist is the error for a name with no object or prefix.
func (t *Tree) notExist(op, name string) error {
	return &fs.PathError{Op: op, Path: t.loc.url(name), Err: fs.ErrNotExist}
}

// fail turns a request's error into one naming the object: a missing key is
// fs.ErrNotExist, anything else is counted as an error. A 404 is a missing
// key only when the store says so (NoSuchKey, or NotFound: a HEAD has no
// body): a missing bucket, or versitygw's unknown access key, is a 404 too,
// and must not show as an empty directory.
func (t *Tree) fail(op, name string, err error) error {
	var re *awshttp.ResponseError
	var api smithy.APIError
	if errors.As(err, &re) && re.HTTPStatusCode() == 404 &&
		(!errors.As(err, &api) || api.ErrorCode() == "NoSuchKey" || api.ErrorCode() == "NotFound") {
		return t.notExist(op, name)
	}
	t.count.errors.Add(1)
	return &fs.PathError{Op: op, Path: t.loc.url(name), Err: requestFailed(err)}
}

// ErrRequest is a request to the store that failed after its retries.
var ErrRequest = errors.New("s3: request failed")

// requestFailed keeps the SDK's one-line account of a failed request (the
// operation, attempts, status, code and message) but not its chain: a
// network errno in it (ECONNREFUSED) is no errno of the file, and the mount
// answers EIO. Cancellation stays visible.
func requestFailed(err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %w", ErrRequest, context.Canceled)
	}
	return fmt.Errorf("%w: %s", ErrRequest, err.Error())
}
