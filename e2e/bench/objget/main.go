// Command objget is the benchmark's helper for object stores: it uploads a
// local directory under a URL (making the bucket), and downloads every
// object under a URL with whole-object GETs, several in flight, discarding
// the bytes: the plain-download baseline a view's cold read is compared to,
// through the same SDK for each store.
//
//	objget put URL DIR
//	objget get URL WORKERS
//
// s3:// reaches $AWS_ENDPOINT_URL with the AWS_* credentials; gs:// reaches
// $STORAGE_EMULATOR_HOST; az:// reaches $AZURE_STORAGE_CONNECTION_STRING.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/storage"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"google.golang.org/api/iterator"
)

// store is one bucket's calls.
type store interface {
	mkbucket(ctx context.Context) error
	put(ctx context.Context, key string, data []byte) error
	list(ctx context.Context, prefix string) ([]string, error)
	get(ctx context.Context, key string) (io.ReadCloser, error)
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: objget put URL DIR | objget get URL WORKERS")
		os.Exit(2)
	}
	ctx := context.Background()
	st, prefix, err := open(ctx, os.Args[2])
	if err == nil {
		switch os.Args[1] {
		case "put":
			err = put(ctx, st, prefix, os.Args[3])
		case "get":
			err = get(ctx, st, prefix, os.Args[3])
		default:
			err = fmt.Errorf("unknown command %q", os.Args[1])
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "objget:", err)
		os.Exit(1)
	}
}

func open(ctx context.Context, url string) (store, string, error) {
	scheme, rest, _ := strings.Cut(url, "://")
	bucket, prefix, _ := strings.Cut(rest, "/")
	switch scheme {
	case "s3":
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, "", err
		}
		return &s3Store{awss3.NewFromConfig(cfg, func(o *awss3.Options) { o.UsePathStyle = true }), bucket}, prefix, nil
	case "gs":
		c, err := storage.NewClient(ctx)
		if err != nil {
			return nil, "", err
		}
		return &gsStore{c.Bucket(bucket)}, prefix, nil
	case "az":
		c, err := azblob.NewClientFromConnectionString(os.Getenv("AZURE_STORAGE_CONNECTION_STRING"), nil)
		if err != nil {
			return nil, "", err
		}
		return &azStore{c, bucket}, prefix, nil
	}
	return nil, "", fmt.Errorf("%s: not s3://, gs:// or az://", url)
}

func put(ctx context.Context, st store, prefix, dir string) error {
	if err := st.mkbucket(ctx); err != nil {
		return err
	}
	return filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return st.put(ctx, prefix+"/"+filepath.ToSlash(rel), data)
	})
}

// get downloads every object under prefix, workers at a time, and prints
// seconds, bytes and objects.
func get(ctx context.Context, st store, prefix, workers string) error {
	n, err := strconv.Atoi(workers)
	if err != nil || n < 1 {
		return fmt.Errorf("workers %q", workers)
	}
	keys, err := st.list(ctx, strings.TrimSuffix(prefix, "/")+"/")
	if err != nil {
		return err
	}
	start := time.Now()
	var total atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan string)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				r, err := st.get(ctx, k)
				if err == nil {
					var m int64
					m, err = io.Copy(io.Discard, r)
					r.Close()
					total.Add(m)
				}
				if err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
				}
			}
		}()
	}
	for _, k := range keys {
		next <- k
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	fmt.Printf("%.4f %d %d\n", time.Since(start).Seconds(), total.Load(), len(keys))
	return nil
}

type s3Store struct {
	c      *awss3.Client
	bucket string
}

func (s *s3Store) mkbucket(ctx context.Context) error {
	_, err := s.c.CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: &s.bucket})
	return err
}

func (s *s3Store) put(ctx context.Context, key string, data []byte) error {
	_, err := s.c.PutObject(ctx, &awss3.PutObjectInput{Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(data)})
	return err
}

func (s *s3Store) list(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	p := awss3.NewListObjectsV2Paginator(s.c, &awss3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys, nil
}

func (s *s3Store) get(ctx context.Context, key string) (io.ReadCloser, error) {
	out, err := s.c.GetObject(ctx, &awss3.GetObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return nil, err
	}
	return out.Body, nil
}

type gsStore struct{ b *storage.BucketHandle }

func (s *gsStore) mkbucket(ctx context.Context) error { return s.b.Create(ctx, "bench", nil) }

func (s *gsStore) put(ctx context.Context, key string, data []byte) error {
	w := s.b.Object(key).NewWriter(ctx)
	if _, err := w.Write(data); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

func (s *gsStore) list(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	it := s.b.Objects(ctx, &storage.Query{Prefix: prefix})
	for {
		a, err := it.Next()
		if err == iterator.Done {
			return keys, nil
		}
		if err != nil {
			return nil, err
		}
		keys = append(keys, a.Name)
	}
}

func (s *gsStore) get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.b.Object(key).NewReader(ctx)
}

type azStore struct {
	c         *azblob.Client
	container string
}

func (s *azStore) mkbucket(ctx context.Context) error {
	_, err := s.c.CreateContainer(ctx, s.container, nil)
	return err
}

func (s *azStore) put(ctx context.Context, key string, data []byte) error {
	_, err := s.c.UploadBuffer(ctx, s.container, key, data, nil)
	return err
}

func (s *azStore) list(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	p := s.c.NewListBlobsFlatPager(s.container, &azblob.ListBlobsFlatOptions{Prefix: &prefix})
	for p.More() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, b := range page.Segment.BlobItems {
			keys = append(keys, *b.Name)
		}
	}
	return keys, nil
}

func (s *azStore) get(ctx context.Context, key string) (io.ReadCloser, error) {
	out, err := s.c.DownloadStream(ctx, s.container, key, nil)
	if err != nil {
		return nil, err
	}
	return out.Body, nil
}
