# SPDX-License-Identifier: MIT
"""libkvpaged.so.1 through ctypes: the C structs and prototypes of <kvpaged.h>, nothing more.

The library is found as $KVPAGED_LIBRARY (a path: the build tree's .libs/libkvpaged.so.1 for
tests), else by the dynamic linker's search ("libkvpaged.so.1", as installed).
"""
import ctypes
import os

u32, u64, i32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
P = ctypes.POINTER


class ConnectOptions(ctypes.Structure):
    _fields_ = [("size", u32), ("socket_path", ctypes.c_char_p), ("pool", ctypes.c_char_p),
                ("ns", ctypes.c_char_p), ("client_name", ctypes.c_char_p),
                ("ring_entries", u32), ("ring_data_bytes", u32), ("spin_us", u32),
                ("error_buf", ctypes.c_void_p), ("error_len", u32)]


class PoolInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("backend", ctypes.c_char * 16),
                ("layers", u32), ("kv_heads", u32), ("head_dim", u32),
                ("element_bytes", u32), ("block_tokens", u32), ("capacity_blocks", u32),
                ("max_seq_tokens", u32), ("vocab_size", u32),
                ("bytes_per_token", u64), ("block_bytes", u64), ("pool_bytes", u64),
                ("block_stride", u64), ("layer_stride", u64), ("kv_stride", u64),
                ("slot_stride", u64), ("head_stride", u64), ("window", u32)]


class Table(ctypes.Structure):
    _fields_ = [("blocks", P(u32)), ("len", u32), ("cap", u32)]


class Retention(ctypes.Structure):
    _fields_ = [("size", u32), ("policy", u32), ("n_sink", u32), ("recent", u32),
                ("budget", u32), ("granularity", u32), ("decay", ctypes.c_float)]


class Op(ctypes.Structure):
    _fields_ = [("opcode", u32), ("arg", u32), ("user_data", u64), ("seq", u64),
                ("extra_key", u64), ("tokens", P(u32)), ("ntokens", u32), ("table_cap", u32),
                ("table_out", P(u32))]


class Completion(ctypes.Structure):
    _fields_ = [("user_data", u64), ("res", i32), ("flags", u32), ("value", u64), ("aux", u32),
                ("table_len", u32)]


def _load():
    path = os.environ.get("KVPAGED_LIBRARY") or "libkvpaged.so.1"
    lib = ctypes.CDLL(path, use_errno=True)
    client = ctypes.c_void_p
    protos = {
        "kvp_connect": (ctypes.c_int, [P(ConnectOptions), P(client)]),
        "kvp_disconnect": (client, [client]),
        "kvp_pool": (P(PoolInfo), [client]),
        "kvp_pool_base": (ctypes.c_void_p, [client]),
        "kvp_namespace": (ctypes.c_char_p, [client]),
        "kvp_last_error": (ctypes.c_char_p, [client]),
        "kvp_table_free": (None, [P(Table)]),
        "kvp_open_retained": (ctypes.c_int, [client, P(u32), u32, u64, u32, P(Retention),
                                             P(u64), P(u32), P(Table)]),
        "kvp_append": (ctypes.c_int, [client, u64, P(u32), u32, P(Table)]),
        "kvp_commit": (ctypes.c_int, [client, u64, u32, P(Table)]),
        "kvp_fork": (ctypes.c_int, [client, u64, P(u64), P(Table)]),
        "kvp_close": (ctypes.c_int, [client, u64]),
        "kvp_lookup": (ctypes.c_int, [client, P(u32), u32, u64, u32, P(u32)]),
        "kvp_seq_info": (ctypes.c_int, [client, u64, P(u32), P(u32), P(Table)]),
        "kvp_park": (ctypes.c_int, [client, u64]),
        "kvp_resume": (ctypes.c_int, [client, u64, P(u32), P(Table)]),
        "kvp_set_wait": (None, [client, u32]),
        "kvp_report_scores": (ctypes.c_int, [client, u64, u32, P(ctypes.c_float), u32]),
        "kvp_seq_packed": (ctypes.c_int, [client, u64, P(Table), P(Table)]),
        "kvp_submit": (ctypes.c_int, [client, ctypes.c_void_p, ctypes.c_uint]),
        "kvp_complete": (ctypes.c_int, [client, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                                        ctypes.c_int]),
        # Since 0.3.0: absent from an older library, where Client.completion_fd() says so.
        "kvp_completion_fd": (ctypes.c_int, [client]),
        "kvp_complete_arm": (ctypes.c_int, [client]),
    }
    for name, (res, args) in protos.items():
        f = getattr(lib, name, None)
        if f is not None:
            f.restype, f.argtypes = res, args
    return lib


def _load_libc():
    libc = ctypes.CDLL(None)
    libc.realloc.restype = ctypes.c_void_p
    libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


lib = _load()
#: the process's malloc family, the library's too: a table filled from a ring completion is
#: grown with realloc, as libkvpaged grows it, and freed by kvp_table_free().
libc = _load_libc()
