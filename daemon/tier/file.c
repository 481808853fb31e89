/* SPDX-License-Identifier: MIT */
/*
 * The file tier: slots in one or more swap files, moved with O_DIRECT through a private
 * io_uring.  Every I/O goes through one of queue_depth staging buffers (4096-aligned, registered
 * with the ring): a store copies header and data into a buffer and queues one write, a load
 * reads a whole slot into a buffer, verifies it there and only then copies the data out.
 * Loads come in batches: file_tier_load() waits for its batch, file_tier_load_start() leaves
 * one batch on the heap that every reap moves on and file_tier_poll() finishes (the eventfd
 * registered with the ring tells the caller's event loop when to poll).
 *
 * Slot layout (docs/tiers-storage.md): a header region (struct slot_header, the block's token
 * ids, zero padding to 4096) then a data region (block_bytes, zero padding to 4096).  Slot i
 * lives in file i % npaths at offset (i / npaths) * slot_bytes.  Numbers are little-endian
 * (configure refuses big-endian hosts).  Both checksums are XXH3 keyed with a secret of the
 * tier's (kept in <first swap file>.key with persist), so only this daemon writes slots it
 * accepts.
 *
 * Not thread-safe: one owner drives the tier (the daemon's I/O thread).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon/log.h"
#include "daemon/tier/tier.h"

#define SLOT_MAGIC UINT64_C(0x31544f4c5350564b) /* "KVPSLOT1" read as little-endian bytes */
/* 2: the checksums are keyed (version 1's were plain XXH3, which anyone can forge). */
#define SLOT_VERSION 2u
#define SLOT_ALIGN 4096u

/*
 * The key file beside the first swap file: a magic and the random key the checksums' secret
 * is derived from.  Only with persist: otherwise a key of the run's own, never written.
 */
#define KEY_MAGIC UINT64_C(0x3159454b5350564b) /* "KVPSKEY1" */
#define KEY_BYTES 32u
#define KEY_SUFFIX ".key"

struct key_file {
	uint64_t magic;
	uint8_t key[KEY_BYTES];
};
static_assert(sizeof(struct key_file) == 40, "on-disk key file");

/* Caps that keep every size product far from overflow and within io_uring's own limits. */
#define FILE_TIER_MAX_QUEUE_DEPTH 4096u
#define FILE_TIER_MAX_TOKENS (1u << 20)
#define FILE_TIER_MAX_BLOCK_BYTES (UINT64_C(1) << 30)

/* On-disk header: the layout is the format; change it only with SLOT_VERSION. */
struct slot_header {
	uint64_t magic;
	uint32_t version;
	uint32_t header_bytes; /* the header region: this struct, the tokens, padding */
	uint64_t block_bytes;
	uint32_t block_tokens;
	uint32_t slot; /* the slot written: catches files reordered or striped differently */
	uint64_t geometry;
	uint64_t hash_lo, hash_hi;
	uint64_t parent_lo, parent_hi;
	uint64_t salt;
	uint64_t extra;
	uint64_t data_sum;   /* keyed XXH3-64 of the block_bytes of data (not the padding) */
	uint64_t header_sum; /* keyed XXH3-64 of this struct and the tokens, this field read as 0 */
	/* uint32_t tokens[block_tokens] follow */
};
static_assert(sizeof(struct slot_header) == 104, "on-disk slot header");
static_assert(offsetof(struct slot_header, header_sum) == 96, "on-disk slot header");

enum buf_state {
	BUF_FREE,
	BUF_WRITE,       /* a store's write in flight */
	BUF_READ_SLOT,   /* a load's read of a whole slot */
	BUF_READ_HEADER, /* a scan's read of a header */
};

struct staging {
	enum buf_state state;
	uint32_t slot;
	uint32_t gen;        /* BUF_WRITE: the slot's generation when stored */
	uint32_t index;      /* reads: the position in the load's or the scan's batch */
	struct batch *batch; /* reads: the batch the read is for */
};

/* The batch a load or a scan is working through, seen by the completion handler. */
struct batch {
	/* a load */
	const uint32_t *slots;
	const struct tier_key *keys;
	void *const *dsts;
	int *results;
	uint32_t n;
	uint32_t next;    /* the first entry neither queued nor served yet */
	uint32_t pending; /* entries whose result is not in yet */
	void (*done)(void *ctx); /* an asynchronous load's; NULL for the sync one */
	void *done_ctx;
	/* a scan */
	void (*found)(void *ctx, uint32_t slot, const struct tier_key *key);
	void *found_ctx;
	uint32_t found_count;
	uint32_t foreign_count; /* slots of another version, layout or striping (not used) */
	int scan_error;
};

struct file_tier {
	struct io_uring ring;
	bool ring_ready;
	int event_fd; /* registered with the ring: readable when completions were posted */
	bool fixed_buffers;
	bool persist;
	int *fds;
	bool *direct; /* per file: O_DIRECT in effect (else the file system refused it) */
	uint32_t npaths;
	uint32_t nslots;
	uint64_t block_bytes;
	uint32_t block_tokens;
	uint64_t geometry;
	uint32_t header_bytes;
	uint64_t data_bytes;
	uint64_t slot_bytes;
	uint32_t queue_depth;
	/*
	 * The checksums' key: XXH3's secret, derived from the key file's random key (persist) or
	 * from a random key of this run.  Without it nobody can write a slot the tier accepts.
	 */
	uint8_t secret[XXH3_SECRET_DEFAULT_SIZE];

	uint8_t *staging_mem;
	size_t staging_mem_bytes;
	struct staging *bufs;
	uint32_t *free_bufs; /* a stack of free buffer indices */
	uint32_t nfree;
	uint32_t writes_in_flight;
	uint32_t reads_in_flight;

	/*
	 * Per slot: the buffer holding its write in flight (UINT32_MAX when none), and a
	 * generation bumped by each store so a late failure of an overwritten store is ignored.
	 */
	uint32_t *slot_buf;
	uint32_t *slot_gen;

	struct batch *batch; /* the load's or the scan's in progress, for the nesting check */
	/*
	 * The asynchronous load (file_tier_load_start), on the heap until its done runs.  Every
	 * reap moves it on, so outside reap_ready() it has entries left to queue only while no
	 * buffer is free: something is in flight whose completion moves it on again.
	 */
	struct batch *async_batch;
	bool store_waiting; /* a store waits for a buffer: reaps keep freed ones for it */
	void (*lost)(void *ctx, uint32_t slot, int err);
	void *lost_ctx;
	struct file_tier_stats stats;
};

#define NO_BUF UINT32_MAX

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static inline uint8_t *buf_mem(const struct file_tier *t, uint32_t b)
{
	return t->staging_mem + (size_t)b * t->slot_bytes;
}

static inline int slot_fd_index(const struct file_tier *t, uint32_t slot)
{
	return (int)(slot % t->npaths);
}

static inline uint64_t slot_offset(const struct file_tier *t, uint32_t slot)
{
	return (uint64_t)(slot / t->npaths) * t->slot_bytes;
}

static uint64_t header_checksum(const struct file_tier *t, const uint8_t *hdr)
{
	struct slot_header copy;
	XXH3_state_t st;

	memcpy(&copy, hdr, sizeof(copy));
	copy.header_sum = 0;
	XXH3_64bits_reset_withSecret(&st, t->secret, sizeof(t->secret));
	XXH3_64bits_update(&st, &copy, sizeof(copy));
	XXH3_64bits_update(&st, hdr + sizeof(copy), (size_t)t->block_tokens * sizeof(uint32_t));
	return XXH3_64bits_digest(&st);
}

/* ---- opening and closing ------------------------------------------------------------------ */

/*
 * Checks, on the opened descriptor, that a file the tier keeps state in is the daemon's own:
 * a regular file of its effective uid that neither group nor others may write, with `links`
 * names (1; 0 for an unnamed scratch file).  A swap path in a directory another user can
 * write must not let that user make the daemon truncate or overwrite some other file through
 * a hard link, nor feed it slots through a file the user owns or may write.
 */
static int check_private_file(int fd, const char *path, nlink_t links)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return log_error_errno(errno, "tier: cannot stat %s: %m", path);
	if (!S_ISREG(st.st_mode)) {
		log_error("tier: %s is not a regular file; refusing it", path);
		return -EINVAL;
	}
	if (st.st_uid != geteuid()) {
		log_error("tier: %s belongs to uid %u, not to this daemon (uid %u); refusing it",
			  path, (unsigned)st.st_uid, (unsigned)geteuid());
		return -EPERM;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		log_error("tier: %s may be written by its group or others (mode %04o); refusing it "
			  "(chmod go-w)", path, (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	if (st.st_nlink != links) {
		log_error("tier: %s has %ju names (hard links), not %ju; refusing it", path,
			  (uintmax_t)st.st_nlink, (uintmax_t)links);
		return -EMLINK;
	}
	return 0;
}

/*
 * Opens a file the tier keeps state in, read-write: never through a symbolic link
 * (O_NOFOLLOW), created (mode 0600) only where nothing is (O_EXCL), and checked as
 * check_private_file() says before the caller touches it.  O_NONBLOCK keeps a FIFO or a device
 * someone put there from holding the open; the caller clears it (set_io_flags).  *ret_created
 * (may be NULL) says whether this call made the file.  0 or -errno (logged).
 */
static int open_private_file(const char *path, int *ret_fd, bool *ret_created)
{
	const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;
	bool created = false;
	int fd = -EBADF, r;

	/* A name that appears or goes between the two opens is looked at again. */
	for (int tries = 0; fd < 0 && tries < 3; tries++) {
		fd = open(path, flags);
		if (fd >= 0 || errno != ENOENT)
			break;
		fd = open(path, flags | O_CREAT | O_EXCL, 0600);
		created = fd >= 0;
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0 && errno == ELOOP) {
		log_error("tier: %s is a symbolic link; refusing it (swap files are never followed)",
			  path);
		return -ELOOP;
	}
	if (fd < 0)
		return log_error_errno(errno, "tier: cannot open %s: %m", path);
	r = check_private_file(fd, path, 1);
	if (r < 0) {
		close(fd);
		return r;
	}
	*ret_fd = fd;
	if (ret_created)
		*ret_created = created;
	return 0;
}

/* The directory a path names a file in ("." for a bare name), allocated; NULL without memory. */
static char *dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		return strdup(".");
	return strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/*
 * A file of the tier's that has no name, in the directory of path (a scratch file: the daemon
 * measures reads beside the swap files in one).  O_TMPFILE where the file system has it, else
 * a random name made with O_CREAT|O_EXCL (mkostemp, mode 0600) and unlinked at once.  Either
 * way no name another user could guess or plant is ever opened, no link is followed, and
 * nothing is left behind, even after a SIGKILL (but for the instant of the fallback's name).
 */
static int open_scratch(const char *path, int *ret_fd)
{
	char *dir = dir_of(path), *name = NULL;
	int fd = -EBADF, r;

	if (!dir)
		return log_error_errno(ENOMEM, "tier: out of memory");
	fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	/* EISDIR: a kernel without O_TMPFILE; EOPNOTSUPP: a file system without it. */
	if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
		if (asprintf(&name, "%s/.kvpaged-scratch-XXXXXX", dir) < 0) {
			name = NULL;
			r = log_error_errno(ENOMEM, "tier: out of memory");
			goto out;
		}
		fd = mkostemp(name, O_CLOEXEC);
		if (fd >= 0 && unlink(name) < 0) {
			r = log_error_errno(errno, "tier: cannot unlink the scratch file %s: %m", name);
			goto out;
		}
	}
	if (fd < 0) {
		r = log_error_errno(errno, "tier: cannot make a scratch file in %s: %m", dir);
		goto out;
	}
	r = check_private_file(fd, dir, 0);
	if (r == 0) {
		*ret_fd = fd;
		fd = -EBADF;
	}
out:
	if (fd >= 0)
		close(fd);
	free(name);
	free(dir);
	return r;
}

/*
 * Turns O_DIRECT on (and the opening's O_NONBLOCK off).  A file system that refuses O_DIRECT
 * (EINVAL) keeps the file buffered: slower, still correct.  *ret_direct says which; 0 or -errno.
 */
static int set_io_flags(int fd, const char *path, bool *ret_direct)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0)
		return log_error_errno(errno, "tier: cannot read the flags of %s: %m", path);
	fl &= ~O_NONBLOCK;
	if (fcntl(fd, F_SETFL, fl | O_DIRECT) == 0) {
		*ret_direct = true;
		return 0;
	}
	if (errno != EINVAL)
		return log_error_errno(errno, "tier: cannot set O_DIRECT on %s: %m", path);
	if (fcntl(fd, F_SETFL, fl) < 0)
		return log_error_errno(errno, "tier: cannot set the flags of %s: %m", path);
	log_warning("tier: %s: no O_DIRECT on this file system, using buffered I/O", path);
	*ret_direct = false;
	return 0;
}

/*
 * A swap file's slots hold K/V computed from prompts, which are as private as the prompts:
 * one its group or others may read (made by hand, or by an older kvpaged) becomes 0600.
 */
static int make_unreadable(int fd, const char *path)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return log_error_errno(errno, "tier: cannot stat %s: %m", path);
	if (!(st.st_mode & (S_IRGRP | S_IROTH)))
		return 0;
	if (fchmod(fd, st.st_mode & 0700) < 0)
		return log_error_errno(errno, "tier: cannot make %s private: %m", path);
	log_notice("tier: %s was readable by its group or others (mode %04o): its slots hold "
		   "prompts' K/V; it is now %04o", path, (unsigned)(st.st_mode & 07777),
		   (unsigned)(st.st_mode & 0700));
	return 0;
}

/*
 * Opens, checks and locks one swap file (sized later, by size_file); a scratch tier's file is
 * unnamed, in path's directory, and needs no lock (nobody else can open it).
 */
static int open_file(const char *path, bool scratch, int *ret_fd, bool *ret_direct)
{
	int fd = -EBADF, r;

	r = scratch ? open_scratch(path, &fd) : open_private_file(path, &fd, NULL);
	if (r < 0)
		return r;
	if (!scratch) {
		r = make_unreadable(fd, path);
		if (r < 0)
			goto fail;
	}
	r = set_io_flags(fd, path, ret_direct);
	if (r < 0)
		goto fail;
	if (scratch)
		goto done;

	/*
	 * Two daemons sharing a swap file would overwrite each other's slots.  A daemon that was
	 * just killed may still hold the lock for a moment: its io_uring keeps the file open
	 * until the kernel tears the ring down, after the process is gone.  So retry for a while.
	 */
	for (int tries = 0;; tries++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			break;
		if (errno != EWOULDBLOCK || tries == 200) {
			r = errno == EWOULDBLOCK ? -EBUSY : -errno;
			log_error_errno(r, "tier: %s is in use: %m", path);
			goto fail;
		}
		usleep(10000);
	}
done:
	*ret_fd = fd;
	return 0;
fail:
	close(fd);
	return r;
}

/*
 * Sizes a swap file to its slots.  forget: old slots must not come back (no persist, or a new
 * key), so the file is truncated first.  Sparse: blocks are allocated as slots are written,
 * and ENOSPC then arrives as a failed write (the lost callback).  Kept, a larger file is left
 * alone rather than cut.
 */
static int size_file(int fd, const char *path, uint64_t size, bool forget)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return log_error_errno(errno, "tier: cannot stat %s: %m", path);
	if (forget && ftruncate(fd, 0) < 0)
		return log_error_errno(errno, "tier: cannot truncate %s: %m", path);
	if ((forget || (uint64_t)st.st_size < size) && ftruncate(fd, (off_t)size) < 0)
		return log_error_errno(errno, "tier: cannot size %s to %llu bytes: %m", path,
				       (unsigned long long)size);
	return 0;
}

/* Whether any swap file holds anything yet (slots a new key would make untrusted). */
static bool files_hold_slots(const struct file_tier *t)
{
	struct stat st;

	for (uint32_t i = 0; i < t->npaths; i++)
		if (fstat(t->fds[i], &st) == 0 && st.st_blocks > 0)
			return true;
	return false;
}

/* The checksums' secret from a key: XXH3 wants a secret whose every bit looks random. */
static void set_secret(struct file_tier *t, const uint8_t key[KEY_BYTES])
{
	(void)XXH3_generateSecret(t->secret, sizeof(t->secret), key, KEY_BYTES);
}

/* KEY_BYTES from the kernel's random generator.  0 or -errno. */
static int random_key(uint8_t key[KEY_BYTES])
{
	ssize_t n;

	do
		n = getrandom(key, KEY_BYTES, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return log_error_errno(errno, "tier: cannot get a random key: %m");
	return n == KEY_BYTES ? 0 : log_error_errno(EIO, "tier: short random key: %m");
}

/* Makes the new key entry of path durable: its directory is synced. */
static void sync_dir_of(const char *path)
{
	char *dir = dir_of(path);
	int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -ENOMEM;

	if (fd < 0 || fsync(fd) < 0)
		log_warning_errno(errno, "tier: cannot sync the directory of %s: %m", path);
	if (fd >= 0)
		close(fd);
	free(dir);
}

/* Writes a new random key into the key file fd (checked to be ours), durably. */
static int write_key(int fd, const char *path, struct key_file *kf)
{
	ssize_t n;
	int r;

	kf->magic = KEY_MAGIC;
	r = random_key(kf->key);
	if (r < 0)
		return r;
	if (ftruncate(fd, 0) < 0)
		return log_error_errno(errno, "tier: cannot truncate %s: %m", path);
	n = pwrite(fd, kf, sizeof(*kf), 0);
	if (n < 0 || fsync(fd) < 0)
		return log_error_errno(errno, "tier: cannot write %s: %m", path);
	return n == (ssize_t)sizeof(*kf) ? 0 : log_error_errno(EIO, "tier: short write of %s: %m",
								path);
}

/*
 * With persist, the checksums' key lives in <first swap file>.key, held to the swap files'
 * rules (a refusal stops the pool) and made (O_EXCL, 0600) where there is none.  A key that is
 * missing, unreadable, or readable by group or others is replaced by a new one: *ret_new then
 * tells the caller to forget what the files hold, since slots made under a key we do not have
 * (or that others may know) cannot be trusted.  Called with the swap files locked, so two
 * daemons never replace each other's key.  0 or -errno.
 */
static int load_key(struct file_tier *t, const char *swap_path, bool *ret_new)
{
	struct key_file kf = { 0 };
	const char *why = NULL;
	struct stat st;
	bool created = false;
	char *path = NULL;
	int fd = -EBADF, r;
	ssize_t n;

	if (asprintf(&path, "%s%s", swap_path, KEY_SUFFIX) < 0)
		return log_error_errno(ENOMEM, "tier: out of memory");
	r = open_private_file(path, &fd, &created);
	if (r < 0)
		goto out;
	if (fstat(fd, &st) < 0) {
		r = log_error_errno(errno, "tier: cannot stat %s: %m", path);
		goto out;
	}
	n = pread(fd, &kf, sizeof(kf), 0);
	if (created)
		why = files_hold_slots(t) ? "there was none" : NULL;
	else if (st.st_mode & (S_IRGRP | S_IROTH))
		why = "its group or others could read it";
	else if (n < 0)
		why = "it cannot be read";
	else if (n != (ssize_t)sizeof(kf) || st.st_size != (off_t)sizeof(kf) ||
		 kf.magic != KEY_MAGIC)
		why = "it is not a key file";
	if (!created && !why) {
		set_secret(t, kf.key);
		*ret_new = false;
		goto out;
	}
	if (!created && (st.st_mode & 07777) != 0600 && fchmod(fd, 0600) < 0) {
		r = log_error_errno(errno, "tier: cannot make %s private: %m", path);
		goto out;
	}
	r = write_key(fd, path, &kf);
	if (r < 0)
		goto out;
	if (created)
		sync_dir_of(path);
	set_secret(t, kf.key);
	*ret_new = true;
	if (why)
		log_warning("tier: %s: %s; a new key replaces it, so the slots already in the swap "
			    "files are not trusted: the file tier starts empty", path, why);
	else
		log_info("tier: made %s, the key of the swap files' checksums", path);
out:
	explicit_bzero(&kf, sizeof(kf));
	if (fd >= 0)
		close(fd);
	free(path);
	return r;
}

static int check_config(const struct file_tier_config *cfg)
{
	if (!cfg || !cfg->paths || cfg->npaths == 0 || cfg->nslots == 0 || cfg->block_bytes == 0 ||
	    cfg->block_bytes > FILE_TIER_MAX_BLOCK_BYTES || cfg->block_tokens == 0 ||
	    cfg->block_tokens > FILE_TIER_MAX_TOKENS || cfg->queue_depth == 0 ||
	    cfg->queue_depth > FILE_TIER_MAX_QUEUE_DEPTH || cfg->npaths > cfg->nslots ||
	    (cfg->scratch && (cfg->npaths != 1 || cfg->persist)))
		return -EINVAL;
	for (uint32_t i = 0; i < cfg->npaths; i++)
		if (!cfg->paths[i])
			return -EINVAL;
	return 0;
}

int file_tier_open(const struct file_tier_config *cfg, struct file_tier **ret)
{
	struct file_tier *t;
	struct iovec *iov = NULL;
	bool new_key = false;
	int r;

	r = check_config(cfg);
	if (r < 0 || !ret)
		return -EINVAL;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->event_fd = -EBADF; /* before any failure: close must not close fd 0 */
	t->npaths = cfg->npaths;
	t->nslots = cfg->nslots;
	t->block_bytes = cfg->block_bytes;
	t->block_tokens = cfg->block_tokens;
	t->geometry = cfg->geometry;
	t->persist = cfg->persist;
	t->queue_depth = cfg->queue_depth;
	t->lost = cfg->lost;
	t->lost_ctx = cfg->lost_ctx;
	t->header_bytes = (uint32_t)round_up(sizeof(struct slot_header) +
					     (uint64_t)t->block_tokens * sizeof(uint32_t),
					     SLOT_ALIGN);
	t->data_bytes = round_up(t->block_bytes, SLOT_ALIGN);
	t->slot_bytes = t->header_bytes + t->data_bytes;

	t->fds = malloc(t->npaths * sizeof(*t->fds));
	t->direct = calloc(t->npaths, sizeof(*t->direct));
	t->bufs = calloc(t->queue_depth, sizeof(*t->bufs));
	t->free_bufs = malloc(t->queue_depth * sizeof(*t->free_bufs));
	t->slot_buf = malloc((size_t)t->nslots * sizeof(*t->slot_buf));
	t->slot_gen = calloc(t->nslots, sizeof(*t->slot_gen));
	iov = calloc(t->queue_depth, sizeof(*iov));
	if (!t->fds || !t->direct || !t->bufs || !t->free_bufs || !t->slot_buf || !t->slot_gen ||
	    !iov) {
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < t->npaths; i++)
		t->fds[i] = -EBADF;
	for (uint32_t s = 0; s < t->nslots; s++)
		t->slot_buf[s] = NO_BUF;

	for (uint32_t i = 0; i < t->npaths; i++) {
		r = open_file(cfg->paths[i], cfg->scratch, &t->fds[i], &t->direct[i]);
		if (r < 0)
			goto fail;
	}
	/* Without persist the files are forgotten anyway: a key of this run's own will do. */
	if (t->persist) {
		r = load_key(t, cfg->paths[0], &new_key);
		if (r < 0)
			goto fail;
	} else {
		uint8_t key[KEY_BYTES];

		r = random_key(key);
		if (r < 0)
			goto fail;
		set_secret(t, key);
		explicit_bzero(key, sizeof(key));
	}
	for (uint32_t i = 0; i < t->npaths; i++) {
		uint64_t slots_here = (t->nslots - i + t->npaths - 1) / t->npaths;

		r = size_file(t->fds[i], cfg->paths[i], slots_here * t->slot_bytes,
			      !t->persist || new_key);
		if (r < 0)
			goto fail;
	}

	/* One region for all buffers: one mapping, page-aligned, slots 4096-aligned inside. */
	t->staging_mem_bytes = (size_t)t->queue_depth * t->slot_bytes;
	t->staging_mem = mmap(NULL, t->staging_mem_bytes, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (t->staging_mem == MAP_FAILED) {
		t->staging_mem = NULL;
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t b = 0; b < t->queue_depth; b++) {
		t->free_bufs[b] = t->queue_depth - 1 - b; /* buffer 0 is taken first */
		iov[b].iov_base = buf_mem(t, b);
		iov[b].iov_len = t->slot_bytes;
	}
	t->nfree = t->queue_depth;

	/* No more I/Os than buffers are ever in flight, so queue_depth entries are enough. */
	r = io_uring_queue_init(t->queue_depth, &t->ring, 0);
	if (r < 0) {
		log_error_errno(r, "tier: cannot set up an io_uring (%m; RLIMIT_MEMLOCK?)");
		goto fail;
	}
	t->ring_ready = true;
	/* The caller's event loop waits on this instead of blocking in the ring. */
	t->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->event_fd < 0) {
		r = log_error_errno(errno, "tier: cannot create an eventfd: %m");
		goto fail;
	}
	r = io_uring_register_eventfd(&t->ring, t->event_fd);
	if (r < 0) {
		log_error_errno(r, "tier: cannot register an eventfd with the io_uring: %m");
		goto fail;
	}
	r = io_uring_register_files(&t->ring, t->fds, t->npaths);
	if (r < 0) {
		log_error_errno(r, "tier: cannot register the swap files: %m");
		goto fail;
	}
	/*
	 * Registered buffers save pinning pages on every I/O, but count against RLIMIT_MEMLOCK
	 * for an unprivileged daemon: without enough, plain reads and writes do the same job.
	 */
	r = io_uring_register_buffers(&t->ring, iov, t->queue_depth);
	if (r < 0)
		log_warning_errno(r, "tier: cannot register %zu bytes of staging buffers (%m; "
				  "raise LimitMEMLOCK=), using unregistered buffers",
				  t->staging_mem_bytes);
	t->fixed_buffers = r >= 0;
	free(iov);
	*ret = t;
	return 0;
fail:
	free(iov);
	file_tier_close(t);
	return r;
}

static void wait_async_reads(struct file_tier *t);

struct file_tier *file_tier_close(struct file_tier *t)
{
	if (!t)
		return NULL;
	/*
	 * done runs only from file_tier_poll(), where it may call into the tier: a tier being
	 * torn down cannot offer that.  The owner polls until file_tier_loading() is false first.
	 */
	assert(!t->async_batch);
	if (t->async_batch) {
		/* Without asserts: no read may land in a buffer being unmapped; done is not run. */
		log_error("tier: closed with an asynchronous load in flight; its done never runs");
		wait_async_reads(t);
		free(t->async_batch);
		t->async_batch = NULL;
	}
	if (t->ring_ready) {
		file_tier_flush(t);
		/* Unregisters the eventfd too. */
		io_uring_queue_exit(&t->ring);
	}
	if (t->event_fd >= 0)
		close(t->event_fd);
	if (t->fds) {
		for (uint32_t i = 0; i < t->npaths; i++) {
			if (t->fds[i] < 0)
				continue;
			/* Slots meant to outlive the daemon should survive a power cut too. */
			if (t->persist && fdatasync(t->fds[i]) < 0)
				log_warning_errno(errno, "tier: fdatasync of a swap file: %m");
			/*
			 * The ring's reference to the file outlives close() (its teardown is
			 * asynchronous), and with it the lock: release the lock ourselves so
			 * the files can be opened again at once.
			 */
			(void)flock(t->fds[i], LOCK_UN);
			close(t->fds[i]);
		}
	}
	if (t->staging_mem)
		munmap(t->staging_mem, t->staging_mem_bytes);
	free(t->fds);
	free(t->direct);
	free(t->bufs);
	free(t->free_bufs);
	free(t->slot_buf);
	free(t->slot_gen);
	free(t);
	return NULL;
}

/* ---- verification ------------------------------------------------------------------------- */

/*
 * Header checks shared by load and scan: 0, -EBADMSG (corrupt, or not made with our key) or
 * -ENOENT (another format or layout).
 */
static int check_header(struct file_tier *t, const uint8_t *mem, uint32_t slot)
{
	const struct slot_header *h = (const struct slot_header *)mem;

	/* Another version's checksum cannot be checked, so it is never served either. */
	if (h->magic == SLOT_MAGIC && h->version != SLOT_VERSION)
		return -ENOENT;
	if (h->header_sum != header_checksum(t, mem))
		return -EBADMSG;
	if (h->magic != SLOT_MAGIC ||
	    h->header_bytes != t->header_bytes || h->block_bytes != t->block_bytes ||
	    h->block_tokens != t->block_tokens || h->geometry != t->geometry || h->slot != slot)
		return -ENOENT;
	return 0;
}

static bool identity_matches(const struct file_tier *t, const uint8_t *mem,
			     const struct tier_key *key)
{
	const struct slot_header *h = (const struct slot_header *)mem;

	return h->hash_lo == key->hash_lo && h->hash_hi == key->hash_hi &&
	       h->parent_lo == key->parent_lo && h->parent_hi == key->parent_hi &&
	       h->salt == key->salt && h->extra == key->extra &&
	       !memcmp(mem + sizeof(*h), key->tokens, (size_t)t->block_tokens * sizeof(uint32_t));
}

/* Verifies a whole slot in a staging buffer and only then copies its data out. */
static int verify_and_copy(struct file_tier *t, const uint8_t *mem, uint32_t slot,
			   const struct tier_key *key, void *dst)
{
	const struct slot_header *h = (const struct slot_header *)mem;
	const uint8_t *data = mem + t->header_bytes;
	int r;

	r = check_header(t, mem, slot);
	if (r == -EBADMSG) {
		t->stats.checksum_errors++;
		return -EBADMSG;
	}
	/* An intact header of another geometry or slot is someone else's block, not damage. */
	if (r < 0 || !identity_matches(t, mem, key)) {
		t->stats.identity_errors++;
		return -EBADMSG;
	}
	if (h->data_sum != XXH3_64bits_withSecret(data, t->block_bytes, t->secret, sizeof(t->secret))) {
		t->stats.checksum_errors++;
		return -EBADMSG;
	}
	memcpy(dst, data, t->block_bytes);
	return 0;
}

/* ---- buffers and completions -------------------------------------------------------------- */

static void release_buf(struct file_tier *t, uint32_t b)
{
	t->bufs[b].state = BUF_FREE;
	t->free_bufs[t->nfree++] = b;
}

static void complete_write(struct file_tier *t, uint32_t b, int res)
{
	uint32_t slot = t->bufs[b].slot, gen = t->bufs[b].gen;
	int err = 0;

	if (res < 0)
		err = res;
	else if ((uint64_t)res != t->slot_bytes)
		err = -EIO; /* short: the slot is torn on disk */

	if (t->slot_buf[slot] == b)
		t->slot_buf[slot] = NO_BUF;
	t->writes_in_flight--;
	release_buf(t, b);

	if (err == 0) {
		t->stats.writes++;
		t->stats.write_bytes += t->slot_bytes;
		return;
	}
	t->stats.write_errors++;
	/* A newer store of the slot has its own write; this failure no longer loses anything. */
	if (gen == t->slot_gen[slot] && t->lost)
		t->lost(t->lost_ctx, slot, err);
}

static void complete_read(struct file_tier *t, uint32_t b, int res)
{
	struct staging *s = &t->bufs[b];
	struct batch *batch = s->batch;
	uint64_t want = s->state == BUF_READ_SLOT ? t->slot_bytes : t->header_bytes;
	uint8_t *mem = buf_mem(t, b);

	assert(batch);
	t->reads_in_flight--;
	if (res < 0 || (uint64_t)res != want) {
		t->stats.read_errors++;
		if (s->state == BUF_READ_SLOT) {
			batch->results[s->index] = -EIO;
			batch->pending--;
		} else {
			batch->scan_error = res < 0 ? res : -EIO;
		}
		release_buf(t, b);
		return;
	}
	t->stats.reads++;
	t->stats.read_bytes += want;

	if (s->state == BUF_READ_SLOT) {
		batch->results[s->index] = verify_and_copy(t, mem, s->slot, &batch->keys[s->index],
							   batch->dsts[s->index]);
		batch->pending--;
	} else {
		const struct slot_header *h = (const struct slot_header *)mem;
		int r = check_header(t, mem, s->slot);

		/* An all-zero header is a slot never written; only a damaged one is counted. */
		if (r == -EBADMSG && h->magic == SLOT_MAGIC)
			t->stats.checksum_errors++;
		if (r == -ENOENT)
			batch->foreign_count++;
		if (r == 0) {
			struct tier_key key = {
				.hash_lo = h->hash_lo,
				.hash_hi = h->hash_hi,
				.parent_lo = h->parent_lo,
				.parent_hi = h->parent_hi,
				.salt = h->salt,
				.extra = h->extra,
				.tokens = (const uint32_t *)(mem + sizeof(*h)),
			};

			batch->found_count++;
			batch->found(batch->found_ctx, s->slot, &key);
		}
	}
	release_buf(t, b);
}

static void handle_cqe(struct file_tier *t, const struct io_uring_cqe *cqe)
{
	uint32_t b = (uint32_t)io_uring_cqe_get_data64(cqe);

	assert(b < t->queue_depth);
	if (t->bufs[b].state == BUF_WRITE)
		complete_write(t, b, cqe->res);
	else
		complete_read(t, b, cqe->res);
}

/* Makes the eventfd readable, so the event loop comes round to file_tier_poll(). */
static void wake_event_loop(struct file_tier *t)
{
	/* Fails only when the counter is about to overflow: readable anyway. */
	(void)eventfd_write(t->event_fd, 1);
}

/*
 * Submits what is queued in the ring, without waiting or reaping (callers may be inside a
 * reap).  What the kernel refuses stays queued: the next submit takes it, and the event loop
 * is woken so that file_tier_poll() retries even when nothing else is in flight.
 */
static void submit_queued(struct file_tier *t)
{
	int r;

	do
		r = io_uring_submit(&t->ring);
	while (r == -EINTR);
	if (r < 0)
		wake_event_loop(t);
}

static uint32_t batch_queue(struct file_tier *t, struct batch *batch);

/*
 * Queues the asynchronous load's next reads into free buffers, unless a store is waiting for
 * one (first come, first served: a store must not wait for a whole batch to be queued).
 */
static uint32_t async_queue(struct file_tier *t)
{
	struct batch *batch = t->async_batch;

	if (!batch || batch->next == batch->n || t->nfree == 0 || t->store_waiting)
		return 0;
	return batch_queue(t, batch);
}

/* Handles every completion already posted, and moves the asynchronous load on; never blocks. */
static unsigned reap_ready(struct file_tier *t)
{
	struct io_uring_cqe *cqe;
	unsigned n = 0;

	while (io_uring_peek_cqe(&t->ring, &cqe) == 0) {
		struct io_uring_cqe done = *cqe;

		/* Mark it seen first: the handler may queue more I/O on this ring. */
		io_uring_cqe_seen(&t->ring, cqe);
		handle_cqe(t, &done);
		n++;
	}
	if (async_queue(t) > 0)
		submit_queued(t);
	return n;
}

/* Blocks for at least one completion, then handles all that are ready. */
static void reap_wait(struct file_tier *t)
{
	int r;

	assert(t->writes_in_flight + t->reads_in_flight > 0);
	while (reap_ready(t) == 0) {
		/* Submits too: an SQE left by a failed submit must not make this wait forever. */
		r = io_uring_submit_and_wait(&t->ring, 1);
		if (r >= 0 || r == -EINTR || r == -EAGAIN || r == -EBUSY || r == -ETIME)
			continue;
		/*
		 * The kernel still owns buffers we cannot account for; going on could hand out
		 * memory that a read is about to overwrite.
		 */
		log_error_errno(r, "tier: waiting for io_uring completions: %m");
		abort();
	}
}

static int submit(struct file_tier *t)
{
	int r;

	for (;;) {
		r = io_uring_submit(&t->ring);
		if (r >= 0)
			return 0;
		if (r == -EINTR)
			continue;
		/* Out of kernel resources for now: completions give some back. */
		if ((r == -EAGAIN || r == -EBUSY) && t->writes_in_flight + t->reads_in_flight > 0) {
			reap_wait(t);
			continue;
		}
		return log_error_errno(r, "tier: io_uring submit: %m");
	}
}

static uint32_t take_buf(struct file_tier *t, bool may_wait)
{
	if (t->nfree == 0)
		reap_ready(t);
	while (t->nfree == 0) {
		if (!may_wait)
			return NO_BUF;
		reap_wait(t);
	}
	return t->free_bufs[--t->nfree];
}

/* Waits until every read of the asynchronous load is done; its done runs at the next poll. */
static void wait_async_reads(struct file_tier *t)
{
	while (t->async_batch && t->async_batch->pending > 0)
		reap_wait(t);
}

static struct io_uring_sqe *get_sqe(struct file_tier *t)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);

	/* The ring has at least queue_depth entries and no more I/Os than buffers exist. */
	assert(sqe);
	return sqe;
}

static void prep_io(struct file_tier *t, uint32_t b, bool write, uint32_t slot, uint32_t len)
{
	struct io_uring_sqe *sqe = get_sqe(t);
	int fd = slot_fd_index(t, slot);
	uint64_t off = slot_offset(t, slot);
	uint8_t *mem = buf_mem(t, b);

	if (write && t->fixed_buffers)
		io_uring_prep_write_fixed(sqe, fd, mem, len, off, (int)b);
	else if (write)
		io_uring_prep_write(sqe, fd, mem, len, off);
	else if (t->fixed_buffers)
		io_uring_prep_read_fixed(sqe, fd, mem, len, off, (int)b);
	else
		io_uring_prep_read(sqe, fd, mem, len, off);
	sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, b);
}

/* ---- the interface ------------------------------------------------------------------------ */

/*
 * memcpy, then the keyed XXH3-64 of what was copied (the value XXH3_64bits_withSecret(dst, n)
 * gives), a chunk at a time: each chunk is hashed while it is still in cache, saving a second
 * pass through memory.
 */
static uint64_t copy_and_hash(const struct file_tier *t, uint8_t *dst, const uint8_t *src,
			      size_t n)
{
	enum { CHUNK = 32 << 10 };
	XXH3_state_t st;

	if (n <= CHUNK) {
		memcpy(dst, src, n);
		return XXH3_64bits_withSecret(dst, n, t->secret, sizeof(t->secret));
	}
	XXH3_64bits_reset_withSecret(&st, t->secret, sizeof(t->secret));
	for (size_t off = 0; off < n; off += CHUNK) {
		size_t len = n - off < CHUNK ? n - off : CHUNK;

		memcpy(dst + off, src + off, len);
		XXH3_64bits_update(&st, dst + off, len);
	}
	return XXH3_64bits_digest(&st);
}

int file_tier_store(struct file_tier *t, uint32_t slot, const struct tier_key *key,
		    const void *data)
{
	struct slot_header *h;
	uint64_t data_sum;
	uint8_t *mem;
	size_t tok_bytes;
	uint32_t b;

	if (slot >= t->nslots)
		return -EINVAL;
	/* Bump first: a failure of the write being replaced must not report this store lost. */
	t->slot_gen[slot]++;
	/* Buffers freed while this store waits are its own before the asynchronous load's. */
	t->store_waiting = true;
	/* Cheap (no system call), and keeps lost reports close to the failures. */
	reap_ready(t);
	/* Two writes of one slot in flight could land in either order; let the older finish. */
	while (t->slot_buf[slot] != NO_BUF)
		reap_wait(t);

	b = take_buf(t, true);
	t->store_waiting = false;
	mem = buf_mem(t, b);
	h = (struct slot_header *)mem;
	tok_bytes = (size_t)t->block_tokens * sizeof(uint32_t);

	/* Of the copy, not of data: it is what reaches the disk. */
	data_sum = copy_and_hash(t, mem + t->header_bytes, data, t->block_bytes);
	/* Zero padding: no stale bytes of other blocks reach the disk. */
	memset(mem + t->header_bytes + t->block_bytes, 0, t->data_bytes - t->block_bytes);
	*h = (struct slot_header){
		.magic = SLOT_MAGIC,
		.version = SLOT_VERSION,
		.header_bytes = t->header_bytes,
		.block_bytes = t->block_bytes,
		.block_tokens = t->block_tokens,
		.slot = slot,
		.geometry = t->geometry,
		.hash_lo = key->hash_lo,
		.hash_hi = key->hash_hi,
		.parent_lo = key->parent_lo,
		.parent_hi = key->parent_hi,
		.salt = key->salt,
		.extra = key->extra,
		.data_sum = data_sum,
	};
	memcpy(mem + sizeof(*h), key->tokens, tok_bytes);
	memset(mem + sizeof(*h) + tok_bytes, 0, t->header_bytes - sizeof(*h) - tok_bytes);
	h->header_sum = header_checksum(t, mem);

	t->bufs[b] = (struct staging){
		.state = BUF_WRITE,
		.slot = slot,
		.gen = t->slot_gen[slot],
	};
	t->slot_buf[slot] = b;
	t->writes_in_flight++;
	prep_io(t, b, true, slot, (uint32_t)t->slot_bytes);
	/* The buffers this store did not need go on to the asynchronous load, in one submit. */
	async_queue(t);
	/*
	 * On failure the write stays queued in the ring and goes with the next submit; the
	 * caller is told so it does not count on the slot.
	 */
	return submit(t);
}

/*
 * Moves a load's batch on without waiting or reaping: serves at once what needs no read (a
 * slot out of range, a slot whose write is still in its staging buffer) and queues reads of
 * the next slots into free buffers, in order, until the buffers run out.  Returns the number
 * of reads queued; the caller submits them.
 */
static uint32_t batch_queue(struct file_tier *t, struct batch *batch)
{
	uint32_t queued = 0;

	while (batch->next < batch->n) {
		uint32_t i = batch->next, slot = batch->slots[i], b;

		if (slot >= t->nslots) {
			batch->results[i] = -EINVAL;
		} else if (t->slot_buf[slot] != NO_BUF) {
			/* Not on disk yet, but the staging buffer holds exactly what will be. */
			batch->results[i] = verify_and_copy(t, buf_mem(t, t->slot_buf[slot]), slot,
							    &batch->keys[i], batch->dsts[i]);
		} else {
			if (t->nfree == 0)
				break;
			b = t->free_bufs[--t->nfree];
			t->bufs[b] = (struct staging){
				.state = BUF_READ_SLOT,
				.slot = slot,
				.index = i,
				.batch = batch,
			};
			t->reads_in_flight++;
			prep_io(t, b, false, slot, (uint32_t)t->slot_bytes);
			queued++;
			batch->next++;
			continue;
		}
		batch->next++;
		batch->pending--;
	}
	/*
	 * An asynchronous load finished here, without a completion of its own to make the
	 * eventfd readable (all served from staging, or nothing to read): the event loop must
	 * still come round to the poll that calls done.
	 */
	if (batch->done && batch->pending == 0)
		wake_event_loop(t);
	return queued;
}

void file_tier_load(struct file_tier *t, uint32_t n, const uint32_t *slots,
		    const struct tier_key *keys, void *const *dsts, int *results)
{
	struct batch batch = {
		.slots = slots,
		.keys = keys,
		.dsts = dsts,
		.results = results,
		.n = n,
		.pending = n,
	};

	assert(!t->batch);
	/* The asynchronous load came first: it finishes first (its done runs at the next poll). */
	wait_async_reads(t);
	t->batch = &batch;
	while (batch.pending > 0) {
		/* A failed submit leaves the reads queued; reap_wait submits them again. */
		if (batch_queue(t, &batch) > 0)
			(void)submit(t);
		/* Still pending: reads of the batch in flight, or no buffer free for the next. */
		if (batch.pending > 0)
			reap_wait(t);
	}
	t->batch = NULL;
}

int file_tier_load_start(struct file_tier *t, uint32_t n, const uint32_t *slots,
			 const struct tier_key *keys, void *const *dsts, int *results,
			 void (*done)(void *ctx), void *ctx)
{
	struct batch *batch;

	if (!done || (n > 0 && (!slots || !keys || !dsts || !results)))
		return -EINVAL;
	/* From lost or found (inside a tier call), or a second batch: one at a time. */
	if (t->batch || t->async_batch)
		return -EBUSY;
	batch = malloc(sizeof(*batch));
	if (!batch)
		return -ENOMEM;
	*batch = (struct batch){
		.slots = slots,
		.keys = keys,
		.dsts = dsts,
		.results = results,
		.n = n,
		.pending = n,
		.done = done,
		.done_ctx = ctx,
	};
	t->async_batch = batch;
	/* No reaping here: done and lost run only from the calls that say so. */
	if (batch_queue(t, batch) > 0)
		submit_queued(t);
	return 0;
}

bool file_tier_loading(const struct file_tier *t)
{
	return t->async_batch != NULL;
}

int file_tier_poll(struct file_tier *t)
{
	struct batch *batch;
	unsigned n = reap_ready(t);

	/* What the kernel refused before (a write, or the batch's reads) goes again. */
	if (io_uring_sq_ready(&t->ring) > 0)
		submit_queued(t);
	batch = t->async_batch;
	if (batch && batch->pending == 0) {
		void (*done)(void *ctx) = batch->done;
		void *ctx = batch->done_ctx;

		/* Gone before done runs: done may start the next batch. */
		t->async_batch = NULL;
		free(batch);
		done(ctx);
	}
	return (int)n;
}

void file_tier_flush(struct file_tier *t)
{
	while (t->writes_in_flight > 0)
		reap_wait(t);
}

int file_tier_scan(struct file_tier *t,
		   void (*found)(void *ctx, uint32_t slot, const struct tier_key *key), void *ctx)
{
	struct batch batch = { .found = found, .found_ctx = ctx };
	uint32_t next = 0;

	if (!found)
		return -EINVAL;
	assert(!t->batch);
	/* The asynchronous load came first: it finishes first (its done runs at the next poll). */
	wait_async_reads(t);
	/* Headers are read from the files: what is still in staging is not there yet. */
	file_tier_flush(t);
	t->batch = &batch;
	while (next < t->nslots || t->reads_in_flight > 0) {
		bool queued = false;

		while (next < t->nslots) {
			uint32_t b = take_buf(t, false);

			if (b == NO_BUF)
				break;
			t->bufs[b] = (struct staging){
				.state = BUF_READ_HEADER,
				.slot = next,
				.index = next,
				.batch = &batch,
			};
			t->reads_in_flight++;
			prep_io(t, b, false, next, t->header_bytes);
			queued = true;
			next++;
		}
		if (queued)
			(void)submit(t);
		if (t->reads_in_flight > 0)
			reap_wait(t);
	}
	t->batch = NULL;
	if (batch.scan_error < 0)
		return log_error_errno(batch.scan_error, "tier: reading slot headers: %m");
	if (batch.foreign_count)
		log_notice("tier: %u slots of another format version, layout or striping are not "
			   "used", batch.foreign_count);
	return (int)batch.found_count;
}

int file_tier_event_fd(const struct file_tier *t)
{
	return t->event_fd;
}

void file_tier_get_stats(const struct file_tier *t, struct file_tier_stats *ret)
{
	*ret = t->stats;
}

uint64_t file_tier_slot_bytes(const struct file_tier *t)
{
	return t->slot_bytes;
}

bool file_tier_direct(const struct file_tier *t, uint32_t file)
{
	return file < t->npaths && t->direct[file];
}
