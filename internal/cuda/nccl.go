package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdlib.h>
#include <string.h>
#include "abi.h"
// ncclSend and ncclRecv: buffer (a device address), count, ncclDataType_t,
// peer rank, communicator, stream.
static int n_send(void *f, unsigned long long buf, size_t count, int type, int peer, void *comm, void *stream) {
	return mbcall_ncclSend(f, (const void *)buf, count, type, peer, comm, stream);
}
static int n_recv(void *f, unsigned long long buf, size_t count, int type, int peer, void *comm, void *stream) {
	return mbcall_ncclRecv(f, (void *)buf, count, type, peer, comm, stream);
}
static int n_init(void *f, void **comm, int nranks, const void *id, int rank) {
	mb_nccl_id v;
	memcpy(&v, id, sizeof v);
	return mbcall_ncclCommInitRank(f, comm, nranks, v, rank);
}
static const char *n_str(void *f, int r) { return f ? mbcall_ncclGetErrorString(f, r) : ""; }
static const char *n_last(void *f, void *comm) { return f ? mbcall_ncclGetLastError(f, comm) : ""; }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// NCCL is NCCL's C API (libnccl.so.2), opened with dlopen (its symbols
// global, for libraries built on it: NCCL EP): communicators of one
// process over several of its GPUs, one rank per GPU, each rank joined and
// driven from its GPU's own thread (ncclCommInitRank with one unique id),
// and grouped point-to-point transfers between them. NCCL runs in the GPUs'
// primary contexts and may leave another one current on the calling thread
// (see Driver.ContextChanged).
//
// Proven here only against a fake libnccl (internal/hostsim/fakes/fakenccl.c); not yet
// run against a real NCCL.
type NCCL struct {
	Path    string
	Version string // e.g. "2.27.3"
	lib     *library
	fn      map[string]unsafe.Pointer
}

// Comm is an NCCL communicator (ncclComm_t): one rank's view.
type Comm unsafe.Pointer

// ncclSymbols are the entry points moebench uses; ncclGetLastError (NCCL
// 2.13 and later) is optional.
var ncclSymbols = []string{"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclGroupStart", "ncclGroupEnd",
	"ncclSend", "ncclRecv", "ncclGetErrorString"}

// ncclUint8 is ncclDataType_t's unsigned byte: transfers are counted in
// bytes, whatever they hold.
const ncclUint8 = 1

// OpenNCCL loads NCCL (MOEBENCH_NCCL overrides) and resolves its entry
// points. Point-to-point transfers need NCCL 2.7 or later.
func OpenNCCL() (*NCCL, error) {
	lib, err := openLibrary("MOEBENCH_NCCL", "libnccl.so.2", "libnccl.so")
	if err != nil {
		return nil, err
	}
	n := &NCCL{Path: lib.path, lib: lib, fn: map[string]unsafe.Pointer{}}
	for _, s := range ncclSymbols {
		if n.fn[s], err = lib.sym(s); err != nil {
			return nil, err
		}
	}
	if p, err := lib.sym("ncclGetLastError"); err == nil {
		n.fn["ncclGetLastError"] = p
	}
	var v C.int
	if err := n.check("ncclGetVersion", nil, C.mbcall_ncclGetVersion(n.fn["ncclGetVersion"], &v)); err != nil {
		return nil, err
	}
	major, minor, patch := ncclVersion(int(v))
	n.Version = fmt.Sprintf("%d.%d.%d", major, minor, patch)
	if major < 2 || major == 2 && minor < 7 {
		return nil, fmt.Errorf("%s: NCCL %s has no point-to-point transfers (2.7 or later needed)", lib.path, n.Version)
	}
	return n, nil
}

// ncclVersion splits NCCL_VERSION_CODE: major·10000 + minor·100 + patch
// since 2.9, major·1000 + minor·100 + patch before.
func ncclVersion(code int) (major, minor, patch int) {
	if code >= 10000 {
		return code / 10000, code % 10000 / 100, code % 100
	}
	return code / 1000, code % 1000 / 100, code % 100
}

// ncclResultNames are ncclResult_t's values (ncclTimeout, 8, since NCCL
// 2.30; TestABIHeaders checks them against nccl.h's).
var ncclResultNames = []string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout"}

// NCCLError is a failed NCCL call: the call, the result's name, NCCL's
// description of it and, where NCCL has one, its last error message.
type NCCLError struct {
	Call, Name, Text, Last string
	Code                   int
}

func (e *NCCLError) Error() string {
	s := fmt.Sprintf("%s: %s (%d, %s)", e.Call, e.Name, e.Code, e.Text)
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}

// check turns a result into an error; comm (nil: none) is asked for its
// last error message.
func (n *NCCL) check(call string, comm Comm, r C.int) error {
	if r == 0 {
		return nil
	}
	e := &NCCLError{Call: call, Code: int(r), Name: fmt.Sprintf("ncclResult %d", int(r)),
		Text: C.GoString(C.n_str(n.fn["ncclGetErrorString"], r)),
		Last: C.GoString(C.n_last(n.fn["ncclGetLastError"], unsafe.Pointer(comm)))}
	if int(r) < len(ncclResultNames) {
		e.Name = ncclResultNames[r]
	}
	return e
}

// UniqueID names the ranks of one communicator (ncclUniqueId, 128 bytes):
// every rank joins with the same one.
type UniqueID [128]byte

// UniqueID makes a new communicator's id (ncclGetUniqueId).
func (n *NCCL) UniqueID() (UniqueID, error) {
	var id C.mb_nccl_id
	err := n.check("ncclGetUniqueId", nil, C.mbcall_ncclGetUniqueId(n.fn["ncclGetUniqueId"], &id))
	return *(*UniqueID)(unsafe.Pointer(&id)), err
}

// InitRank joins communicator id as rank of nranks, on the GPU whose
// context is current on the calling thread (ncclCommInitRank). It is
// collective: it returns once every rank has called, each from its own
// thread (NCCL refuses two ranks on one GPU).
func (n *NCCL) InitRank(nranks int, id UniqueID, rank int) (Comm, error) {
	var c unsafe.Pointer
	cid := C.CBytes(id[:])
	defer C.free(cid)
	err := n.check(fmt.Sprintf("ncclCommInitRank(rank %d of %d)", rank, nranks), nil,
		C.n_init(n.fn["ncclCommInitRank"], &c, C.int(nranks), cid, C.int(rank)))
	return Comm(c), err
}

// Destroy frees a communicator (ncclCommDestroy).
func (n *NCCL) Destroy(c Comm) error {
	return n.check("ncclCommDestroy", nil, C.mbcall_ncclCommDestroy(n.fn["ncclCommDestroy"], unsafe.Pointer(c)))
}

// GroupStart opens a group on the calling thread: its transfers up to
// GroupEnd are issued together.
func (n *NCCL) GroupStart() error {
	return n.check("ncclGroupStart", nil, C.mbcall_ncclGroupStart(n.fn["ncclGroupStart"]))
}

// GroupEnd issues the group's transfers on their streams.
func (n *NCCL) GroupEnd() error {
	return n.check("ncclGroupEnd", nil, C.mbcall_ncclGroupEnd(n.fn["ncclGroupEnd"]))
}

// Send queues bytes from buf to rank peer of c's communicator on s (a
// stream of c's GPU).
func (n *NCCL) Send(buf DevicePtr, bytes int64, peer int, c Comm, s Stream) error {
	return n.check(fmt.Sprintf("ncclSend(%d bytes to rank %d)", bytes, peer), c,
		C.n_send(n.fn["ncclSend"], C.ulonglong(buf), C.size_t(bytes), ncclUint8, C.int(peer), unsafe.Pointer(c), unsafe.Pointer(s)))
}

// Recv queues the receipt of bytes from rank peer into buf on s.
func (n *NCCL) Recv(buf DevicePtr, bytes int64, peer int, c Comm, s Stream) error {
	return n.check(fmt.Sprintf("ncclRecv(%d bytes from rank %d)", bytes, peer), c,
		C.n_recv(n.fn["ncclRecv"], C.ulonglong(buf), C.size_t(bytes), ncclUint8, C.int(peer), unsafe.Pointer(c), unsafe.Pointer(s)))
}
