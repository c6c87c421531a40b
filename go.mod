module github.com/ckptfs/ckptfs

go 1.24
