package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestS3Root(t *testing.T) {
	for _, tc := range []struct {
		src, root, top, rel, err string
	}{
		{src: "s3://bk1/run/step", top: "s3://bk1/run/step", rel: "."},
		{src: "s3://bk1/run/step", root: "s3://bk1/run", top: "s3://bk1/run", rel: "step"},
		{src: "s3://bk1/run/step/", root: "s3://bk1/run/", top: "s3://bk1/run/", rel: "step"},
		{src: "s3://bk1/run/step", root: "s3://bk1", top: "s3://bk1", rel: "run/step"},
		{src: "s3://bk1/run", root: "s3://bk1/run", top: "s3://bk1/run", rel: "."},
		{src: "s3://bk1/runs/step", root: "s3://bk1/run", err: "is not inside --root"},
		{src: "s3://bk1/run/step", root: "s3://bk2/run", err: "is not inside --root"},
		{src: "s3://bk1/run", root: "s3://bk1/run/step", err: "is not inside --root"},
		{src: "s3://bk1/run/step", root: "/local", err: "--root"},
		{src: "s3://bk1/run/../x", err: "plain path"},
	} {
		top, rel, err := s3Root(tc.src, tc.root)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.src+" in "+tc.root)
			continue
		}
		require.NoError(t, err, tc.src)
		assert.Equal(t, tc.top, top, tc.src)
		assert.Equal(t, tc.rel, rel, tc.src)
	}
}
