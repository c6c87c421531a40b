package objstore

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/source"
)

// keysStore lists keys as S3 does (prefix, delimiter, pages of pageSize
// keys and prefixes), counting its LISTs and HEADs; it has no bytes.
type keysStore struct {
	keys        []string // sorted
	pageSize    int
	lists, head atomic.Int64
}

func (s *keysStore) Head(_ context.Context, key string) (Object, error) {
	s.head.Add(1)
	if _, ok := slices.BinarySearch(s.keys, key); ok {
		return Object{Key: key, Size: int64(len(key)), Version: "v-" + key}, nil
	}
	return Object{}, ErrNotFound
}

func (s *keysStore) List(_ context.Context, prefix string, delim bool, limit int, token string) (Page, error) {
	s.lists.Add(1)
	size := s.pageSize
	if limit > 0 {
		size = min(size, limit)
	}
	from := 0
	if token != "" {
		from, _ = strconv.Atoi(token)
	}
	var page Page
	for i := from; i < len(s.keys); i++ {
		k := s.keys[i]
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		if len(page.Objects)+len(page.Prefixes) == size {
			page.Next = strconv.Itoa(i)
			break
		}
		if j := strings.Index(k[len(prefix):], "/"); delim && j >= 0 {
			p := k[:len(prefix)+j+1]
			if n := len(page.Prefixes); n == 0 || page.Prefixes[n-1] != p {
				page.Prefixes = append(page.Prefixes, p)
			}
			continue
		}
		page.Objects = append(page.Objects, Object{Key: k, Size: int64(len(k)), Version: "v-" + k})
	}
	return page, nil
}

func (s *keysStore) Read(context.Context, Object, io.Writer, int64, int64) (int64, error) {
	return 0, errors.New("no bytes")
}

// The keys of a prefix, hostile ones among them: a key both an object and
// a prefix (the object wins), a directory marker, "..", "." and empty
// segments (hidden, with what lies below them), a key outside the prefix.
var treeKeys = []string{
	"other/x",
	"run/",
	"run/a/.metadata",
	"run/a/__0_0.distcp",
	"run/a/b/c/d",
	"run/a/b/e",
	"run/a/dots/../up",
	"run/a/dots/./here",
	"run/a/empty//x",
	"run/f",
	"run/f/g",
	"run/marker/",
	"run/top",
}

// dump is everything a tree says of its directories and names, and the
// errors, as text.
func dump(t *testing.T, tree *Tree) []string {
	var out []string
	for _, name := range []string{".", "a", "a/b", "a/b/c", "a/dots", "a/empty", "f", "marker", "missing", "a/missing", "top", "a/.metadata/x"} {
		ents, err := tree.ReadDir(name)
		if err != nil {
			out = append(out, "readdir "+name+": "+errKind(err))
		}
		for _, e := range ents {
			out = append(out, "readdir "+name+": "+e.Name+" "+e.Mode.String()+" "+strconv.FormatInt(e.Size, 10)+" "+e.Version+" "+e.ID)
		}
	}
	for _, name := range []string{".", "a", "a/.metadata", "a/b/c/d", "a/b", "a/dots", "a/dots/up", "f", "f/g", "marker", "top", "missing", "a/missing", "a/b/missing"} {
		e, err := tree.Stat(name)
		if err != nil {
			out = append(out, "stat "+name+": "+errKind(err))
			continue
		}
		out = append(out, "stat "+name+": "+e.Name+" "+e.Mode.String()+" "+strconv.FormatInt(e.Size, 10)+" "+e.Version+" "+e.ID)
	}
	return out
}

func errKind(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "not exist"
	case err != nil:
		return "error " + err.Error()
	}
	return ""
}

// One LIST of the whole prefix answers the open, every Stat and ReadDir of
// the directories under it and of names that are none, the same as a
// delimited listing of each directory (a prefix of more than a page) does.
func TestTreeListsThePrefixOnce(t *testing.T) {
	open := func(pageSize int) (*Tree, *keysStore) {
		s := &keysStore{keys: slices.Clone(treeKeys), pageSize: pageSize}
		slices.Sort(s.keys)
		tree, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "run"}, s, Limits{ListTTL: 1 << 40}, new(Counters))
		require.NoError(t, err)
		t.Cleanup(func() { tree.Close() })
		return tree, s
	}
	whole, s := open(1000)
	got := dump(t, whole)
	assert.Equal(t, int64(1), s.lists.Load(), "LISTs")
	assert.Equal(t, int64(0), s.head.Load(), "HEADs")

	paged, s := open(2) // the prefix is more than a page: each directory listed
	want := dump(t, paged)
	assert.Greater(t, s.lists.Load(), int64(5))
	assert.Equal(t, want, got)
	assert.Contains(t, got, "stat f: f ---------- 5 v-run/f s3://b/run/f", "the object wins")
	assert.Contains(t, got, "readdir missing: not exist")
	assert.Contains(t, got, "stat a/dots/up: not exist")
	assert.Contains(t, got, "readdir a: empty d--------- 0  s3://b/run/a/empty/")
	for _, line := range got {
		assert.NotRegexp(t, `^readdir .*(other|up|here)|^readdir a/empty: `, line, "a key no name reaches")
	}

	_, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "none"}, &keysStore{keys: treeKeys, pageSize: 1000}, Limits{}, new(Counters))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// A listing refused by the store fails the open naming the prefix, as the
// store's error (no directory is made up).
func TestTreeOpenListingFails(t *testing.T) {
	s := &listingStore{memStore: &memStore{count: new(Counters)}, listed: true,
		err: Classified(errors.New("AccessDenied"), source.ErrDenied)}
	_, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "p"}, s, Limits{}, new(Counters))
	require.ErrorIs(t, err, ErrRequest)
	assert.Contains(t, err.Error(), "s3://b/p")
}

// walk is everything a tree shows from its root down (directories listed,
// every name stated), as text, within a bound.
func walk(tree *Tree) []string {
	var out []string
	dirs := []string{"."}
	for len(dirs) > 0 && len(out) < 10000 {
		dir := dirs[0]
		dirs = dirs[1:]
		ents, err := tree.ReadDir(dir)
		if err != nil {
			out = append(out, "readdir "+dir+": "+errKind(err))
		}
		for _, e := range ents {
			name := path.Join(dir, e.Name)
			got, err := tree.Stat(name)
			out = append(out, "stat "+name+": "+got.Name+" "+got.Mode.String()+" "+got.Version+" "+errKind(err))
			if e.IsDir() {
				dirs = append(dirs, name)
			}
		}
		for _, missing := range []string{"none", ".hf_metadata"} {
			_, err := tree.ReadDir(path.Join(dir, missing))
			out = append(out, "readdir "+path.Join(dir, missing)+": "+errKind(err))
		}
	}
	return out
}

// Whatever keys a store holds, the listing of the whole prefix shows the
// same tree as a delimited listing of each directory, and the open fails
// alike.
func FuzzTreeListing(f *testing.F) {
	f.Add(strings.Join(treeKeys, "\n"))
	f.Add("run/a\nrun/a/b\nrun/a/b/c")
	f.Add("run//\nrun/./x\nrun/../y\nrun/x/")
	f.Add("other\nrun")
	f.Fuzz(func(t *testing.T, keys string) {
		var ks []string
		for _, k := range strings.Split(keys, "\n") {
			if len(ks) < 200 {
				ks = append(ks, "run/"+k)
			}
		}
		slices.Sort(ks)
		ks = slices.Compact(ks)
		open := func(pageSize int) ([]string, error) {
			s := &keysStore{keys: ks, pageSize: pageSize}
			tree, err := Open(Location{Scheme: "s3://", Bucket: "b", Prefix: "run"}, s, Limits{ListTTL: 1 << 40}, new(Counters))
			if err != nil {
				return nil, err
			}
			defer tree.Close()
			return walk(tree), nil
		}
		whole, err := open(1000)
		paged, err2 := open(1)
		require.Equal(t, errKind(err2), errKind(err))
		require.Equal(t, paged, whole)
	})
}
