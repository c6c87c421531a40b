// Command rawfuse measures the FUSE transports go-fuse v2.12.1 lacks. It is
// a null server like nullfs (one read-only file whose reads return a
// static buffer), written against the kernel protocol directly, with the
// transport chosen by a flag:
//
//   - dev: requests are read from and answered on one /dev/fuse fd by a
//     few goroutines, as go-fuse does;
//   - clone: each goroutine reads its own /dev/fuse fd, cloned from the
//     mount's (FUSE_DEV_IOC_CLONE): the kernel keeps a processing list per
//     fd;
//   - uring: FUSE over io_uring (kernel 6.14+, with the fuse module's
//     enable_uring on): one ring per CPU queue, each served by a thread
//     pinned to that CPU; a request arrives as a completion and its reply
//     is committed with the next fetch, one io_uring_enter for a batch.
//
// Its file's byte at offset o is pattern(o mod 4096): every read is at a page
// offset, so the content does not depend on how the kernel splits reads.
//
//	rawfuse [-size BYTES] [-transport dev|clone|uring] [-threads N] [-depth N] [-pin=false] [-max-write BYTES] MNT
//
// It mounts as root with mount(2), serves until the mount goes away, and
// is a benchmark tool only: it answers no more of the protocol than a
// cold sequential read of its one file needs.
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Kernel protocol numbers not spelled in go-fuse's exported API.
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opOpen        = 14
	opRead        = 15
	opStatfs      = 17
	opRelease     = 18
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opAccess      = 34
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42
	opReaddirplus = 44

	inHeaderSize  = 40
	outHeaderSize = 16

	capOverIOURing = 1 << 41
	capInitExt     = 1 << 30

	devIocClone = 0x8004e500 // _IOR(229, 0, uint32)

	fileIno = 2
)

type server struct {
	// Requests served by each transport, reported at exit: a uring run
	// whose reads came on /dev/fuse measured nothing.
	devReqs, ringReqs atomic.Int64

	size    int64
	data    []byte // the static reply: maxWrite bytes of the pattern
	fileOut fuse.Attr
	rootOut fuse.Attr
}

func pattern(off int) byte { return byte((off%4096)*7 + (off%4096)/251) }

func newServer(size int64, maxWrite int) *server {
	s := &server{size: size, data: make([]byte, maxWrite)}
	for i := range s.data {
		s.data[i] = pattern(i)
	}
	s.fileOut = fuse.Attr{Ino: fileIno, Size: uint64(size), Blocks: uint64(size+511) / 512, Mode: syscall.S_IFREG | 0o444, Nlink: 1, Blksize: 4096}
	s.rootOut = fuse.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o555, Nlink: 2, Blksize: 4096}
	return s
}

// reply is what handle answers: an errno, or a fixed-size out struct and/or
// a read's bytes. noReply is set for requests the kernel expects no answer to.
type reply struct {
	errno   syscall.Errno
	out     []byte // the op's out struct, in scratch
	data    []byte // READ's bytes (a slice of s.data)
	noReply bool
	destroy bool
}

func asBytes[T any](p *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), unsafe.Sizeof(*p))
}

// handle answers one request: h its header, op its op-specific struct and
// payload (a LOOKUP's name), scratch room for the out struct.
func (s *server) handle(h *fuse.InHeader, op []byte, scratch []byte) reply {
	switch h.Opcode {
	case opForget, opBatchForget, opInterrupt:
		return reply{noReply: true}
	case opDestroy:
		return reply{destroy: true}
	case opLookup:
		name, _, _ := bytes.Cut(op, []byte{0})
		if h.NodeId != 1 || string(name) != "data" {
			return reply{errno: syscall.ENOENT}
		}
		out := (*fuse.EntryOut)(unsafe.Pointer(&scratch[0]))
		*out = fuse.EntryOut{NodeId: fileIno, Generation: 1, EntryValid: 3600, AttrValid: 3600, Attr: s.fileOut}
		return reply{out: scratch[:unsafe.Sizeof(*out)]}
	case opGetattr:
		out := (*fuse.AttrOut)(unsafe.Pointer(&scratch[0]))
		*out = fuse.AttrOut{AttrValid: 3600, Attr: s.rootOut}
		if h.NodeId == fileIno {
			out.Attr = s.fileOut
		}
		return reply{out: scratch[:unsafe.Sizeof(*out)]}
	case opOpen, opOpendir:
		out := (*fuse.OpenOut)(unsafe.Pointer(&scratch[0]))
		*out = fuse.OpenOut{Fh: 1, OpenFlags: fuse.FOPEN_KEEP_CACHE}
		return reply{out: scratch[:unsafe.Sizeof(*out)]}
	case opRead:
		// fuse_read_in: fh, offset, size, ...
		if len(op) < 20 {
			return reply{errno: syscall.EINVAL}
		}
		off := int64(binary.LittleEndian.Uint64(op[8:]))
		n := min(int64(binary.LittleEndian.Uint32(op[16:])), int64(len(s.data)), max(s.size-off, 0))
		return reply{data: s.data[:n]}
	case opStatfs:
		out := (*fuse.StatfsOut)(unsafe.Pointer(&scratch[0]))
		*out = fuse.StatfsOut{Bsize: 4096, NameLen: 255, Frsize: 4096}
		return reply{out: scratch[:unsafe.Sizeof(*out)]}
	case opRelease, opReleasedir, opFlush, opAccess, opReaddir, opReaddirplus:
		return reply{} // an empty directory, and nothing to release
	}
	return reply{errno: syscall.ENOSYS}
}

// devLoop serves requests read from fd until the mount goes away.
func (s *server) devLoop(fd int, done func()) {
	defer done()
	buf := make([]byte, len(s.data)+64*1024)
	scratch := make([]byte, 256)
	var hdr fuse.OutHeader
	for {
		n, err := unix.Read(fd, buf)
		// ENOENT: the request was interrupted before it was read (its
		// caller got a signal); the next one follows.
		if err == syscall.EINTR || err == syscall.EAGAIN || err == syscall.ENOENT {
			continue
		}
		if err != nil || n < inHeaderSize {
			return // ENODEV: unmounted
		}
		h := (*fuse.InHeader)(unsafe.Pointer(&buf[0]))
		s.devReqs.Add(1)
		r := s.handle(h, buf[inHeaderSize:n], scratch)
		if r.destroy {
			return
		}
		if r.noReply {
			continue
		}
		if r.errno != 0 {
			r.out, r.data = nil, nil // an error is the header alone
		}
		hdr = fuse.OutHeader{Length: uint32(outHeaderSize + len(r.out) + len(r.data)), Status: -int32(r.errno), Unique: h.Unique}
		if _, err := unix.Writev(fd, [][]byte{asBytes(&hdr), r.out, r.data}); err != nil && err != syscall.ENOENT {
			return
		}
	}
}

// initConn answers the kernel's INIT on fd: requests of up to maxWrite
// bytes, and FUSE over io_uring if uring.
func initConn(fd int, maxWrite int, uring bool) error {
	buf := make([]byte, 64*1024)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return fmt.Errorf("read INIT: %w", err)
	}
	h := (*fuse.InHeader)(unsafe.Pointer(&buf[0]))
	if h.Opcode != opInit || n < inHeaderSize+16 {
		return fmt.Errorf("first request is opcode %d, not INIT", h.Opcode)
	}
	major := binary.LittleEndian.Uint32(buf[inHeaderSize:])
	minor := binary.LittleEndian.Uint32(buf[inHeaderSize+4:])
	maxRA := binary.LittleEndian.Uint32(buf[inHeaderSize+8:])
	flags := uint64(binary.LittleEndian.Uint32(buf[inHeaderSize+12:]))
	if n >= inHeaderSize+20 {
		flags |= uint64(binary.LittleEndian.Uint32(buf[inHeaderSize+16:])) << 32
	}
	if major != 7 || minor < 36 {
		return fmt.Errorf("kernel FUSE %d.%d: 7.36 or later needed", major, minor)
	}
	want := uint64(fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_MAX_PAGES | capInitExt | fuse.CAP_PARALLEL_DIROPS)
	if uring {
		if flags&capOverIOURing == 0 {
			return errors.New("the kernel does not offer FUSE over io_uring: echo Y > /sys/module/fuse/parameters/enable_uring")
		}
		want |= capOverIOURing
	}
	out := fuse.InitOut{
		Major: 7, Minor: minor, MaxReadAhead: maxRA, MaxBackground: 12, CongestionThreshold: 9,
		MaxWrite: uint32(maxWrite), TimeGran: 1, MaxPages: uint16(maxWrite / 4096),
	}
	got := flags & want
	out.Flags, out.Flags2 = uint32(got), uint32(got>>32)
	hdr := fuse.OutHeader{Length: uint32(outHeaderSize + unsafe.Sizeof(out)), Unique: h.Unique}
	_, err = unix.Writev(fd, [][]byte{asBytes(&hdr), asBytes(&out)})
	return err
}

func main() {
	size := flag.Int64("size", 1<<30, "size of the file in bytes")
	transport := flag.String("transport", "dev", "dev, clone or uring")
	threads := flag.Int("threads", 4, "dev and clone: goroutines reading requests")
	depth := flag.Int("depth", 8, "uring: ring entries per CPU queue")
	maxWrite := flag.Int("max-write", 1<<20, "largest request in bytes")
	pin := flag.Bool("pin", true, "uring: pin each queue's thread to its CPU, as libfuse does")
	flag.Parse()
	if flag.NArg() != 1 || (*transport != "dev" && *transport != "clone" && *transport != "uring") {
		fmt.Fprintln(os.Stderr, "usage: rawfuse [flags] MNT")
		flag.PrintDefaults()
		os.Exit(2)
	}
	dev, ring, err := run(flag.Arg(0), *size, *transport, *threads, *depth, *maxWrite, *pin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rawfuse:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "rawfuse: %s: %d requests on /dev/fuse, %d on rings\n", *transport, dev, ring)
}

// run mounts the server at mnt and serves until the mount goes away; it
// returns how many requests came on /dev/fuse and how many on the rings.
func run(mnt string, size int64, transport string, threads, depth, maxWrite int, pin bool) (devReqs, ringReqs int64, err error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fd)
	if err := unix.Mount("rawfuse", mnt, "fuse.rawfuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return 0, 0, fmt.Errorf("mount %s: %w", mnt, err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; unix.Unmount(mnt, unix.MNT_DETACH) }()

	if err := initConn(fd, maxWrite, transport == "uring"); err != nil {
		unix.Unmount(mnt, unix.MNT_DETACH)
		return 0, 0, err
	}
	s := newServer(size, maxWrite)
	var wg sync.WaitGroup
	switch transport {
	case "dev":
		for range threads {
			wg.Add(1)
			go s.devLoop(fd, wg.Done)
		}
	case "clone":
		for i := range threads {
			cfd := fd
			if i > 0 {
				if cfd, err = cloneDev(fd); err != nil {
					unix.Unmount(mnt, unix.MNT_DETACH)
					return 0, 0, err
				}
			}
			wg.Add(1)
			go s.devLoop(cfd, wg.Done)
		}
	case "uring":
		// FORGET and INTERRUPT still come on /dev/fuse.
		wg.Add(1)
		go s.devLoop(fd, wg.Done)
		ncpu, err := possibleCPUs()
		if err != nil {
			unix.Unmount(mnt, unix.MNT_DETACH)
			return 0, 0, err
		}
		errs := make(chan error, ncpu)
		var ready sync.WaitGroup
		for q := range ncpu {
			wg.Add(1)
			ready.Add(1)
			go func() {
				defer wg.Done()
				errs <- s.uringQueue(fd, q, depth, pin, ready.Done)
			}()
		}
		ready.Wait()
		select {
		case err := <-errs:
			if err != nil {
				unix.Unmount(mnt, unix.MNT_DETACH)
				return 0, 0, err
			}
		default:
		}
	}
	wg.Wait()
	return s.devReqs.Load(), s.ringReqs.Load(), nil
}

func cloneDev(fd int) (int, error) {
	nfd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	src := uint32(fd)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(nfd), devIocClone, uintptr(unsafe.Pointer(&src))); e != 0 {
		unix.Close(nfd)
		return -1, fmt.Errorf("FUSE_DEV_IOC_CLONE: %w", e)
	}
	return nfd, nil
}

// possibleCPUs is the kernel's num_possible_cpus(): one ring queue each.
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	var lo, hi int
	if n, _ := fmt.Sscanf(string(b), "%d-%d", &lo, &hi); n == 2 {
		return hi + 1, nil
	}
	return 1, nil
}

// --- io_uring ---------------------------------------------------------

const (
	setupSQE128  = 1 << 10
	setupCQSize  = 1 << 3
	enterGetEvts = 1
	featSingleMM = 1
	offSQRing    = 0
	offCQRing    = 0x8000000
	offSQEs      = 0x10000000
	opURingCmd   = 46
	sqeSize      = 128
	cqeSize      = 16

	cmdRegister       = 1
	cmdCommitAndFetch = 2

	// struct fuse_uring_req_header: in_out[128], op_in[128], ring_ent_in_out.
	hdrOpIn     = 128
	hdrEntInOut = 256
	hdrSize     = 4096 // one page, as libfuse allocates it
)

type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type uringParams struct {
	SqEntries, CqEntries, Flags, SqThreadCPU, SqThreadIdle, Features, WqFd uint32
	Resv                                                                   [3]uint32
	SqOff                                                                  sqringOffsets
	CqOff                                                                  cqringOffsets
}

type ring struct {
	fd                       int
	sqHead, sqTail, sqMask   *uint32
	sqArray                  []uint32
	sqes                     []byte
	cqHead, cqTail, cqMask   *uint32
	cqes                     []byte
	pending                  uint32 // SQEs written, not yet submitted
	sqRing, cqRing, sqesMmap []byte
}

func newRing(entries uint32) (*ring, error) {
	p := uringParams{Flags: setupSQE128 | setupCQSize, CqEntries: entries * 2}
	rfd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", e)
	}
	r := &ring{fd: int(rfd)}
	sqLen := int(p.SqOff.Array + p.SqEntries*4)
	cqLen := int(p.CqOff.Cqes + p.CqEntries*cqeSize)
	var err error
	if p.Features&featSingleMM != 0 {
		sqLen = max(sqLen, cqLen)
	}
	if r.sqRing, err = unix.Mmap(r.fd, offSQRing, sqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, err
	}
	r.cqRing = r.sqRing
	if p.Features&featSingleMM == 0 {
		if r.cqRing, err = unix.Mmap(r.fd, offCQRing, cqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
			return nil, err
		}
	}
	if r.sqesMmap, err = unix.Mmap(r.fd, offSQEs, int(p.SqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, err
	}
	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead, r.sqTail, r.sqMask = u32(r.sqRing, p.SqOff.Head), u32(r.sqRing, p.SqOff.Tail), u32(r.sqRing, p.SqOff.RingMask)
	r.sqArray = unsafe.Slice(u32(r.sqRing, p.SqOff.Array), p.SqEntries)
	r.sqes = r.sqesMmap
	r.cqHead, r.cqTail, r.cqMask = u32(r.cqRing, p.CqOff.Head), u32(r.cqRing, p.CqOff.Tail), u32(r.cqRing, p.CqOff.RingMask)
	r.cqes = r.cqRing[p.CqOff.Cqes:]
	return r, nil
}

// sqe returns the next submission entry, zeroed. The ring has as many SQEs
// as entries in flight, so it never runs out.
func (r *ring) sqe() []byte {
	tail := *r.sqTail + r.pending
	i := tail & *r.sqMask
	r.sqArray[i] = i
	r.pending++
	e := r.sqes[int(i)*sqeSize : int(i+1)*sqeSize]
	clear(e)
	return e
}

// submitAndWait publishes the pending SQEs and waits for a completion.
func (r *ring) submitAndWait() error {
	n := r.pending
	atomic.StoreUint32(r.sqTail, *r.sqTail+n)
	r.pending = 0
	for {
		_, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), 1, enterGetEvts, 0, 0)
		if e == syscall.EINTR {
			n = 0
			continue
		}
		if e != 0 {
			return fmt.Errorf("io_uring_enter: %w", e)
		}
		return nil
	}
}

// entry is one registered request slot of a queue: the header page and
// the payload buffer the kernel copies requests into and replies out of.
type entry struct {
	hdr     []byte
	payload []byte
	iov     [2]unix.Iovec
	static  bool // payload holds s.data, so a READ reply copies nothing
}

func fuseCmd(e []byte, fd int, op uint32, ent int, qid int, commit uint64) {
	e[0] = opURingCmd
	binary.LittleEndian.PutUint32(e[4:], uint32(fd))
	binary.LittleEndian.PutUint32(e[8:], op) // cmd_op
	binary.LittleEndian.PutUint64(e[32:], uint64(ent))
	// struct fuse_uring_cmd_req in the command area at 48: flags, commit_id, qid.
	binary.LittleEndian.PutUint64(e[56:], commit)
	binary.LittleEndian.PutUint16(e[64:], uint16(qid))
}

// uringQueue serves queue qid from one thread, pinned to CPU qid if pin.
func (s *server) uringQueue(fd, qid, depth int, pin bool, registered func()) error {
	runtime.LockOSThread()
	if pin {
		var set unix.CPUSet
		set.Set(qid)
		_ = unix.SchedSetaffinity(0, &set)
	}
	r, err := newRing(uint32(depth))
	if err != nil {
		registered()
		return err
	}
	ents := make([]*entry, depth)
	for i := range ents {
		hdr, err1 := unix.Mmap(-1, 0, hdrSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		pay, err2 := unix.Mmap(-1, 0, len(s.data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err := errors.Join(err1, err2); err != nil {
			registered()
			return err
		}
		copy(pay, s.data)
		e := &entry{hdr: hdr, payload: pay, static: true}
		e.iov[0].Base, e.iov[0].Len = &hdr[0], uint64(len(hdr))
		e.iov[1].Base, e.iov[1].Len = &pay[0], uint64(len(pay))
		ents[i] = e
		sqe := r.sqe()
		fuseCmd(sqe, fd, cmdRegister, i, qid, 0)
		binary.LittleEndian.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
		binary.LittleEndian.PutUint32(sqe[24:], 2)
	}
	registered()
	for {
		if err := r.submitAndWait(); err != nil {
			return err
		}
		head := *r.cqHead
		tail := atomic.LoadUint32(r.cqTail)
		for ; head != tail; head++ {
			c := r.cqes[int(head&*r.cqMask)*cqeSize:]
			i := int(binary.LittleEndian.Uint64(c))
			res := int32(binary.LittleEndian.Uint32(c[8:]))
			switch {
			case res == -int32(syscall.ENOTCONN), res == -int32(syscall.ECONNABORTED):
				return nil // unmounted
			case res == -int32(syscall.EAGAIN) || res == -int32(syscall.EINTR):
				e := ents[i]
				sqe := r.sqe()
				fuseCmd(sqe, fd, cmdRegister, i, qid, 0)
				binary.LittleEndian.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
				binary.LittleEndian.PutUint32(sqe[24:], 2)
				continue
			case res == -int32(syscall.ENOENT):
				// The commit's request was interrupted and is gone; so is
				// this entry's slot (the queue serves on with the others).
				continue
			case res < 0:
				return fmt.Errorf("queue %d: %w", qid, syscall.Errno(-res))
			}
			s.uringServe(r, ents[i], fd, i, qid)
		}
		atomic.StoreUint32(r.cqHead, head)
	}
}

// uringServe answers the request in e and queues its commit, which also
// fetches e's next request.
func (s *server) uringServe(r *ring, e *entry, fd, i, qid int) {
	h := (*fuse.InHeader)(unsafe.Pointer(&e.hdr[0]))
	commit := binary.LittleEndian.Uint64(e.hdr[hdrEntInOut+8:])
	inSz := binary.LittleEndian.Uint32(e.hdr[hdrEntInOut+16:])
	// The op struct is in op_in; a LOOKUP's name is the payload.
	op := e.hdr[hdrOpIn : hdrOpIn+128]
	if h.Opcode == opLookup {
		op = e.payload[:inSz]
	}
	var scratch [256]byte
	s.ringReqs.Add(1)
	rep := s.handle(h, op, scratch[:])
	unique := h.Unique
	var n int
	switch {
	case rep.errno != 0:
	case rep.data != nil:
		if !e.static {
			copy(e.payload, s.data)
			e.static = true
		}
		n = len(rep.data)
	default:
		n = copy(e.payload, rep.out)
		e.static = e.static && n == 0
	}
	out := (*fuse.OutHeader)(unsafe.Pointer(&e.hdr[0]))
	*out = fuse.OutHeader{Length: uint32(outHeaderSize + n), Status: -int32(rep.errno), Unique: unique}
	binary.LittleEndian.PutUint32(e.hdr[hdrEntInOut+16:], uint32(n))
	fuseCmd(r.sqe(), fd, cmdCommitAndFetch, i, qid, commit)
}
