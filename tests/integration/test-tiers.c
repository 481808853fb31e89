/* SPDX-License-Identifier: MIT */
/*
 * The tiers below the pool on the real daemon: swap of a parked sequence through the host tier
 * into a swap file and back, byte for byte; a corrupted swap file; a full file system;
 * persistence across a SIGKILL, with a corrupted slot header; a forged slot never served; swap
 * files planted as links refused; the bandwidth measured in a file without a name; and the
 * swap file's I/O mode (O_DIRECT or buffered) as the daemon holds it and reports it.
 */
#include <dirent.h>
#include <sched.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "proto/ring.h"
#include "tests/integration/harness.h"
#include "tests/slot-forge.h"

static struct daemon d;

/*
 * 1 layer, 1 head, dim 4, f32, 16 tokens: 512-byte blocks.  A small pool over a host tier of 4
 * blocks over one swap file.
 */
#define POOL_FMT                                                                               \
	"[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"             \
	"block_tokens = 16\ncapacity_blocks = %u\nhost_tier_blocks = %u\n"                     \
	"file_tier_blocks = %u\nswap_files = %s\nfile_tier_persist = %s\n"

static char pools[1024];
static char swap_path[256];

/* Every byte depends on the block's tag and its offset, so misplaced bytes show. */
static uint8_t pattern(uint8_t tag, uint64_t i)
{
	return (uint8_t)(tag * 131 + i * 7 + (i >> 8));
}

static void write_block(struct kvp_client *c, uint32_t block, uint8_t tag)
{
	const struct kvp_pool_info *p = kvp_pool(c);
	uint8_t *b = (uint8_t *)kvp_pool_base(c) + (uint64_t)block * p->block_stride;

	for (uint64_t i = 0; i < p->block_bytes; i++)
		b[i] = pattern(tag, i);
}

static bool block_is(struct kvp_client *c, uint32_t block, uint8_t tag)
{
	const struct kvp_pool_info *p = kvp_pool(c);
	const uint8_t *b = (uint8_t *)kvp_pool_base(c) + (uint64_t)block * p->block_stride;

	for (uint64_t i = 0; i < p->block_bytes; i++)
		if (b[i] != pattern(tag, i))
			return false;
	return true;
}

static char swap_dir[64];

/* The swap files live in a directory of their own, which outlives a daemon restart. */
static void make_swap_dir(void)
{
	strcpy(swap_dir, "/tmp/kvpaged-swap-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(swap_dir));
}

static void remove_swap_dir(void)
{
	char key[sizeof(swap_path) + 8];

	snprintf(key, sizeof(key), "%s.key", swap_path); /* with persistence */
	unlink(key);
	unlink(swap_path);
	ck_assert_int_eq(rmdir(swap_dir), 0);
}

static void setup_pools(unsigned capacity, unsigned host, unsigned file, bool persist)
{
	snprintf(swap_path, sizeof(swap_path), "%s/swap0", swap_dir);
	snprintf(pools, sizeof(pools), POOL_FMT, capacity, host, file, swap_path,
		 persist ? "yes" : "no");
}

/* Opens a prompt of n tokens, writes each block's pattern (tag + i), commits, returns the id. */
static uint64_t fill(struct kvp_client *c, const uint32_t *t, uint32_t n, uint8_t tag,
		     struct kvp_table *tab)
{
	uint32_t cached = 0;
	uint64_t s;

	ck_assert_int_eq(kvp_open(c, t, n, 0, KVP_OPEN_PRIORITY(5), &s, &cached, tab), 0);
	for (uint32_t i = cached / 16; i < tab->len; i++)
		write_block(c, tab->blocks[i], (uint8_t)(tag + i));
	ck_assert_int_eq(kvp_commit(c, s, n, tab), 0);
	return s;
}

/* Where "key": "value" first occurs in JSON text (any spacing), or NULL. */
static const char *json_find_str(const char *text, const char *key, const char *value)
{
	char pat[64];
	size_t vlen = strlen(value);

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	for (const char *p = strstr(text, pat); p; p = strstr(p + 1, pat)) {
		const char *v = p + strlen(pat);

		v += strspn(v, " \t\n");
		if (*v == '"' && !strncmp(v + 1, value, vlen) && v[vlen + 1] == '"')
			return p;
	}
	return NULL;
}

/* A tier's field from kvpagedctl --json stats ("host" or "file"). */
static long long tier_int(const char *out, const char *tier, const char *key)
{
	const char *p = json_find_str(out, "tier", tier);

	ck_assert_msg(p != NULL, "no %s tier in %s", tier, out);
	return json_int(p, key);
}

/* Offset of the first 512-byte run in the swap file equal to block pattern tag, or -1. */
static off_t find_in_swap(uint8_t tag)
{
	uint8_t want[512], buf[512];
	int fd = open(swap_path, O_RDONLY | O_CLOEXEC);
	off_t off = -1;

	ck_assert_int_ge(fd, 0);
	for (int i = 0; i < 512; i++)
		want[i] = pattern(tag, (uint64_t)i);
	for (off_t o = 0; pread(fd, buf, sizeof(buf), o) == (ssize_t)sizeof(buf); o += 4096)
		if (!memcmp(buf, want, sizeof(buf))) {
			off = o;
			break;
		}
	close(fd);
	return off;
}

static void flip_byte(off_t off)
{
	int fd = open(swap_path, O_RDWR | O_CLOEXEC);
	uint8_t b;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

/*
 * a (4 blocks) is parked and preempted by b: it is swapped (no cost model: a transfer loses no
 * work), its blocks go to the host tier as b takes their memory; c's prompt then pushes b's
 * blocks into the host tier and a's on into the swap file.  Resuming a brings its blocks back
 * from the file, byte for byte; b's prompt, reopened, comes back whole from the tiers.
 */
START_TEST(test_swap_through_host_and_file)
{
	uint32_t ta[64], tb[128], tc[128], rec = 99, cached = 0;
	struct kvp_table tab_a = { 0 }, tab_b = { 0 }, tab_c = { 0 }, tr = { 0 };
	struct kvp_client *c1, *c2;
	uint64_t sa, sb, sc;
	char out[16384];

	make_swap_dir();
	setup_pools(8, 4, 64, false);
	daemon_start(&d, pools);
	prompt(ta, 64, 100);
	prompt(tb, 128, 3000);
	prompt(tc, 128, 6000);
	c1 = connect_ns(NULL, 0);
	c2 = connect_ns(NULL, 0);

	sa = fill(c1, ta, 64, 0x10, &tab_a);
	ck_assert_int_eq(kvp_park(c1, sa), 0);
	sb = fill(c2, tb, 128, 0x30, &tab_b); /* 8 blocks: a must go */
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "preemptions"), 1);
	ck_assert_int_eq(json_int(out, "swaps"), 1);
	ck_assert_msg(json_find_str(out, "decision", "swap") != NULL, "%s", out);
	ck_assert_int_eq(tier_int(out, "host", "demotions"), 4);
	ck_assert_int_eq(kvp_close(c2, sb), 0);

	sc = fill(c2, tc, 128, 0x50, &tab_c); /* b's 8 blocks go down, pushing a's to the file */
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "host", "demotions"), 12);
	ck_assert_int_eq(tier_int(out, "file", "demotions"), 8);
	ck_assert_int_eq(kvp_close(c2, sc), 0);
	assert_verified(&d);

	ck_assert_int_eq(kvp_resume(c1, sa, &rec, &tr), 0);
	ck_assert_uint_eq(rec, 16); /* the last block holds the last token: recomputed */
	ck_assert_uint_eq(tr.len, 4);
	for (uint32_t i = 0; i < 3; i++)
		ck_assert_msg(block_is(c1, tr.blocks[i], (uint8_t)(0x10 + i)),
			      "block %u of the resumed sequence differs", i);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "promotions"), 3);

	/* b's prompt comes back whole from the tiers, wherever its blocks went. */
	ck_assert_int_eq(kvp_close(c1, sa), 0);
	ck_assert_int_eq(kvp_open(c2, tb, 128, 0, 0, &sb, &cached, &tab_b), 0);
	ck_assert_uint_eq(cached, 128);
	for (uint32_t i = 0; i < 8; i++)
		ck_assert_msg(block_is(c2, tab_b.blocks[i], (uint8_t)(0x30 + i)),
			      "block %u of the reopened prompt differs", i);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "host", "promotions") + tier_int(out, "file", "promotions"),
			 3 + 8);
	assert_verified(&d);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
	kvp_table_free(&tab_a);
	kvp_table_free(&tab_b);
	kvp_table_free(&tab_c);
	kvp_table_free(&tr);
	daemon_stop(&d);
	remove_swap_dir();
}
END_TEST

/* Waits (up to 2 s) until the swap file holds block pattern tag; returns its offset. */
static off_t wait_in_swap(uint8_t tag)
{
	off_t off = -1;

	for (int i = 0; i < 200 && (off = find_in_swap(tag)) < 0; i++)
		msleep(10);
	ck_assert_msg(off >= 0, "block %#x never reached the swap file", tag);
	return off;
}

/*
 * A byte flipped in a swapped block is caught by the checksum: the load is a counted miss,
 * the block and everything after it are recomputed, and nothing wrong reaches the client.
 */
START_TEST(test_corrupt_swap_file_is_recomputed)
{
	uint32_t ta[64], tb[128], rec = 0;
	struct kvp_table tab_a = { 0 }, tab_b = { 0 }, tr = { 0 };
	struct kvp_client *c1, *c2;
	uint64_t sa, sb;
	char out[16384];

	make_swap_dir();
	setup_pools(8, 0, 64, false); /* no host tier: the pool demotes straight to the file */
	daemon_start(&d, pools);
	prompt(ta, 64, 100);
	prompt(tb, 128, 3000);
	c1 = connect_ns(NULL, 0);
	c2 = connect_ns(NULL, 0);
	sa = fill(c1, ta, 64, 0x10, &tab_a);
	ck_assert_int_eq(kvp_park(c1, sa), 0);
	sb = fill(c2, tb, 128, 0x30, &tab_b);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "demotions"), 4);

	flip_byte(wait_in_swap(0x11) + 100);
	ck_assert_int_eq(kvp_close(c2, sb), 0);
	ck_assert_int_eq(kvp_resume(c1, sa, &rec, &tr), 0);
	ck_assert_uint_eq(rec, 48); /* block 0 came back; block 1 was bad, so 1..3 recompute */
	ck_assert(block_is(c1, tr.blocks[0], 0x10));
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "promotions"), 1);
	ck_assert_int_eq(tier_int(out, "file", "load_errors"), 1);
	ck_assert_int_eq(tier_int(out, "file", "checksum_errors"), 1);
	assert_verified(&d);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
	kvp_table_free(&tab_a);
	kvp_table_free(&tab_b);
	kvp_table_free(&tr);
	daemon_stop(&d);
	remove_swap_dir();
}
END_TEST

static void kill_daemon(struct daemon *dm)
{
	int status;

	kill(dm->pid, SIGKILL);
	ck_assert_int_eq(waitpid(dm->pid, &status, 0), dm->pid);
	unlink(dm->sock);
	unlink(dm->admin);
	unlink(dm->conf);
	unlink(dm->log);
	rmdir(dm->dir);
}

/*
 * A persistent pool (no host tier) whose swap file holds the 5 blocks of prompt tp (tags
 * 0x10..0x14), pushed down by another prompt's 8: where the restart tests begin.  The daemon
 * is left running.
 */
static void persist_five_in_file(uint32_t tp[80])
{
	struct kvp_table tab = { 0 };
	struct kvp_client *c;
	uint32_t tq[128];

	make_swap_dir();
	setup_pools(8, 0, 64, true);
	daemon_start(&d, pools);
	prompt(tp, 80, 100);
	prompt(tq, 128, 3000);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_close(c, fill(c, tp, 80, 0x10, &tab)), 0);
	ck_assert_int_eq(kvp_close(c, fill(c, tq, 128, 0x30, &tab)), 0);
	for (uint8_t i = 0; i < 5; i++)
		wait_in_swap((uint8_t)(0x10 + i));
	kvp_disconnect(c);
	kvp_table_free(&tab);
}

/* The end of a restart test: promotions blocks came from the file; the daemon stops clean. */
static void end_restart_test(struct kvp_client *c, struct kvp_table *tab, long long promotions)
{
	char out[16384];

	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "promotions"), promotions);
	assert_verified(&d);
	kvp_disconnect(c);
	kvp_table_free(tab);
	daemon_stop(&d);
	remove_swap_dir();
}

/*
 * With file_tier_persist, cached blocks in the swap file survive a SIGKILL: the restarted
 * daemon finds them, checks each slot, and serves the prefix from them.  A slot whose header
 * was damaged is dropped, so the prefix ends there.
 */
START_TEST(test_persistence_across_sigkill)
{
	uint32_t tp[80], cached = 0;
	struct kvp_table tab = { 0 };
	struct kvp_client *c;
	uint64_t s;

	persist_five_in_file(tp);
	kill_daemon(&d);

	/* Damage the header of the slot holding block 3 (it sits in front of the data). */
	flip_byte(find_in_swap(0x13) - 4096 + 8);

	daemon_start(&d, pools);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(c, tp, 80, 0, 0, &s, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 48); /* blocks 0..2 came back; block 3's slot was dropped */
	for (uint32_t i = 0; i < 3; i++)
		ck_assert_msg(block_is(c, tab.blocks[i], (uint8_t)(0x10 + i)),
			      "block %u differs after the restart", i);
	end_restart_test(c, &tab, 3);
}
END_TEST

/*
 * Three prompts on a pool of 8 blocks over a host tier of 4 and a swap file: a (4 blocks) is
 * pushed down to the file by b (8), whose last 4 then sit in the host tier and first 4 in the
 * pool beside c's 4.
 */
static const uint32_t stop_lens[3] = { 64, 128, 64 };
static const uint8_t stop_tags[3] = { 0x10, 0x30, 0x50 };
static uint32_t stop_prompts[3][128];

static void fill_three(void)
{
	struct kvp_table tab = { 0 };
	struct kvp_client *c = connect_ns(NULL, 0);
	char out[16384];

	for (int i = 0; i < 3; i++) {
		prompt(stop_prompts[i], stop_lens[i], 100 + 10000 * (uint32_t)i);
		ck_assert_int_eq(kvp_close(c, fill(c, stop_prompts[i], stop_lens[i], stop_tags[i],
						   &tab)), 0);
	}
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "host", "used_blocks"), 4);
	ck_assert_int_eq(tier_int(out, "file", "used_blocks"), 4);
	for (uint8_t i = 0; i < 4; i++)
		wait_in_swap((uint8_t)(0x10 + i)); /* a's blocks are in the file */
	kvp_disconnect(c);
	kvp_table_free(&tab);
}

/* After a restart: how much of each prompt is found, each found block checked bytewise. */
static void expect_found(const uint32_t found[3])
{
	struct kvp_table tab = { 0 };
	struct kvp_client *c = connect_ns(NULL, 0);
	uint32_t cached = 0;
	uint64_t s;

	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(kvp_open(c, stop_prompts[i], stop_lens[i], 0, 0, &s, &cached, &tab),
				 0);
		ck_assert_msg(cached == found[i], "prompt %d: %u tokens found, not %u", i, cached,
			      found[i]);
		for (uint32_t k = 0; k < cached / 16; k++)
			ck_assert_msg(block_is(c, tab.blocks[k], (uint8_t)(stop_tags[i] + k)),
				      "prompt %d: block %u differs after the restart", i, k);
		ck_assert_int_eq(kvp_close(c, s), 0);
	}
	assert_verified(&d);
	kvp_disconnect(c);
	kvp_table_free(&tab);
}

/*
 * With file_tier_persist: after a SIGKILL what had reached the swap file comes back (a, pushed
 * down by eviction) and nothing else; after a SIGTERM the daemon also writes what was only in
 * the pool and in the host tier down to the file once its sessions are gone, logs it in one
 * line, and every prompt comes back whole from the file tier.  file_tier_persist_stop_ms = 0
 * writes nothing extra.
 */
START_TEST(test_persistence_across_sigterm)
{
	static const uint32_t only_a[3] = { 64, 0, 0 }, all[3] = { 64, 128, 64 };
	char out[16384];

	/* SIGKILL: a only. */
	make_swap_dir();
	setup_pools(8, 4, 64, true);
	daemon_start(&d, pools);
	fill_three();
	kill_daemon(&d);
	daemon_start(&d, pools);
	expect_found(only_a);
	kill_daemon(&d);
	remove_swap_dir();

	/* SIGTERM: the pool's 8 cached blocks and the host tier's 4 go down too. */
	make_swap_dir();
	setup_pools(8, 4, 64, true);
	daemon_start(&d, pools);
	fill_three();
	kill(d.pid, SIGTERM);
	ck_assert_int_eq(daemon_wait_exit(&d), 0);
	ck_assert_msg(daemon_log_has(&d, "stopping: wrote 12 cached blocks to the swap files (8 "
				     "from the pool, 4 from the host tier; 0 writes failed, 0 "
				     "dropped)"), "no line on what the stop wrote");
	ck_assert(daemon_log_has(&d, "; nothing left behind"));
	daemon_remove_files(&d);
	daemon_start(&d, pools);
	ck_assert(daemon_log_has(&d, "16 cached blocks found in the swap files"));
	expect_found(all);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "promotions"), 16);
	kill_daemon(&d);
	remove_swap_dir();

	/* file_tier_persist_stop_ms = 0: as after a SIGKILL. */
	make_swap_dir();
	setup_pools(8, 4, 64, true);
	strncat(pools, "file_tier_persist_stop_ms = 0\n", sizeof(pools) - strlen(pools) - 1);
	daemon_start(&d, pools);
	fill_three();
	daemon_stop(&d);
	daemon_start(&d, pools);
	expect_found(only_a);
	daemon_stop(&d);
	remove_swap_dir();
}
END_TEST

/*
 * With file_tier_persist, a slot forged by someone who knows the format but not the key (other
 * data under the block's identity, checksums as plain XXH3) is not restored: the prefix ends in
 * front of it and its bytes never reach a client, while the genuine slots before it come back
 * after the restart.
 */
START_TEST(test_forged_slot_is_not_served)
{
	uint32_t tp[80], cached = 0;
	uint8_t forged[512];
	struct kvp_table tab = { 0 };
	struct kvp_client *c;
	uint64_t s;
	char out[16384];

	persist_five_in_file(tp);
	daemon_stop(&d);

	/* Block 1's slot: its header sits in front of its data. */
	for (int i = 0; i < 512; i++)
		forged[i] = pattern(0x77, (uint64_t)i);
	ck_assert_int_eq(forge_slot(swap_path, (uint64_t)find_in_swap(0x11) - 4096, 4096, 16,
				    forged, sizeof(forged), 0), 0);

	daemon_start(&d, pools);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(c, tp, 80, 0, 0, &s, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 16); /* block 0 came back; block 1's slot was not trusted */
	ck_assert(block_is(c, tab.blocks[0], 0x10));
	for (uint32_t i = 1; i < tab.len; i++)
		ck_assert_msg(!block_is(c, tab.blocks[i], 0x77), "the forged block was served");
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_ge(tier_int(out, "file", "checksum_errors"), 1);
	end_restart_test(c, &tab, 1);
}
END_TEST

/*
 * A swap file planted as a symbolic link (to a file root must not truncate) or as a hard link:
 * the pool does not start, the daemon says why, and the file it led to is untouched.
 */
START_TEST(test_unsafe_swap_file_is_refused)
{
	static const char content[] = "a file the daemon must never truncate\n";
	char victim[128], log[8192], got[sizeof(content)];
	const char *how[] = { "symlink", "hard link" };
	int fd;

	make_swap_dir();
	snprintf(victim, sizeof(victim), "%s/victim", swap_dir);
	fd = open(victim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, content, sizeof(content)), (ssize_t)sizeof(content));
	close(fd);
	for (int i = 0; i < 2; i++) {
		setup_pools(8, 0, 64, i == 1);
		ck_assert_int_eq(i == 0 ? symlink(victim, swap_path) : link(victim, swap_path), 0);
		ck_assert_int_ne(daemon_refuses(pools, log, sizeof(log)), 0);
		ck_assert_msg(strstr(log, i == 0 ? "is a symbolic link; refusing it"
						 : "has 2 names (hard links), not 1; refusing it"),
			      "%s: %s", how[i], log);
		fd = open(victim, O_RDONLY | O_CLOEXEC);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(read(fd, got, sizeof(got)), (ssize_t)sizeof(content));
		ck_assert_msg(!memcmp(got, content, sizeof(content)), "%s: the victim changed", how[i]);
		close(fd);
		ck_assert_int_eq(unlink(swap_path), 0);
	}
	unlink(victim);
	remove_swap_dir();
}
END_TEST

/*
 * file_tier_bandwidth = auto measures reads of a scratch file beside the swap file.  That file
 * has no name (O_TMPFILE here), so no one can plant a link where it would be: the only name
 * created in the swap directory is the swap file's.
 */
START_TEST(test_bandwidth_measured_in_an_unnamed_file)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	char names[1024] = "";
	ssize_t n;
	int in;

	make_swap_dir();
	setup_pools(8, 0, 64, false);
	strncat(pools, "file_tier_bandwidth = auto\n", sizeof(pools) - strlen(pools) - 1);
	in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	ck_assert_int_ge(in, 0);
	ck_assert_int_ge(inotify_add_watch(in, swap_dir, IN_CREATE | IN_MOVED_TO), 0);
	daemon_start(&d, pools);
	ck_assert(daemon_log_has(&d, "measured tier bandwidth"));
	while ((n = read(in, buf, sizeof(buf))) > 0)
		for (char *p = buf; p < buf + n;) {
			struct inotify_event *e = (struct inotify_event *)p;

			if (e->len && strcmp(e->name, "swap0"))
				snprintf(names + strlen(names), sizeof(names) - strlen(names), " %s",
					 e->name);
			p += sizeof(*e) + e->len;
		}
	close(in);
	ck_assert_msg(!names[0], "names created beside the swap file:%s", names);
	daemon_stop(&d);
	remove_swap_dir();
}
END_TEST

/* Whether the file system of dir takes O_DIRECT: a scratch file opened there with it. */
static bool dir_takes_o_direct(const char *dir)
{
	char path[128];
	int fd;

	snprintf(path, sizeof(path), "%s/probe-o-direct", dir);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
	unlink(path);
	if (fd >= 0)
		close(fd);
	return fd >= 0;
}

/* The open flags of the running daemon's descriptor for path (/proc/PID/fdinfo), or -1. */
static long daemon_fd_flags(const char *path)
{
	char link[320], target[256], info[320];
	long flags = -1;
	struct dirent *e;
	DIR *dir;

	snprintf(link, sizeof(link), "/proc/%d/fd", (int)d.pid);
	dir = opendir(link);
	ck_assert_ptr_nonnull(dir);
	while (flags < 0 && (e = readdir(dir))) {
		ssize_t n;
		FILE *f;

		snprintf(link, sizeof(link), "/proc/%d/fd/%s", (int)d.pid, e->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n < 0)
			continue;
		target[n] = '\0';
		if (strcmp(target, path))
			continue;
		snprintf(info, sizeof(info), "/proc/%d/fdinfo/%s", (int)d.pid, e->d_name);
		f = fopen(info, "r");
		ck_assert_ptr_nonnull(f);
		while (fgets(info, sizeof(info), f))
			if (!strncmp(info, "flags:", 6))
				flags = strtol(info + 6, NULL, 8);
		fclose(f);
	}
	closedir(dir);
	return flags;
}

/*
 * Starts the daemon with its swap file in swap_dir and checks the I/O mode it reports: the
 * descriptor it holds for the file carries O_DIRECT exactly when direct, kvpagedctl says so
 * (text and JSON), and a fallback to buffered I/O is logged.
 */
static void check_io_mode(bool direct)
{
	char out[16384];
	long flags;

	setup_pools(8, 0, 64, false);
	daemon_start(&d, pools);
	flags = daemon_fd_flags(swap_path);
	ck_assert_msg(flags >= 0, "the daemon holds no descriptor for %s", swap_path);
	ck_assert_msg(!!(flags & O_DIRECT) == direct, "flags %lo of %s", flags, swap_path);
	ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
	ck_assert_msg(json_find_str(out, "file_tier_io", direct ? "direct" : "buffered"), "%s", out);
	ck_assert_msg(json_find_str(out, "path", swap_path), "%s", out);
	ck_assert_msg(json_find_str(out, "io", direct ? "direct" : "buffered"), "%s", out);
	ck_assert_int_eq(daemon_log_has(&d, "no O_DIRECT on this file system"), !direct);
	printf("swap file in %s: %s I/O\n", swap_dir, direct ? "direct" : "buffered");
	daemon_stop(&d);
}

/*
 * O_DIRECT is asserted where the swap directory's file system takes it, and a file system that
 * refuses it (ramfs, mounted for the test in a mount namespace of its own, or /dev/shm if
 * this kernel's tmpfs refuses it) gets buffered I/O that operators can see.
 */
START_TEST(test_swap_file_io_mode)
{
	bool ramfs = false;

	make_swap_dir();
	if (dir_takes_o_direct(swap_dir))
		check_io_mode(true);
	else
		printf("%s refuses O_DIRECT: only the fallback is checked there\n", swap_dir);
	if (!dir_takes_o_direct(swap_dir)) {
		check_io_mode(false);
	} else if (!dir_takes_o_direct("/dev/shm")) {
		remove_swap_dir();
		strcpy(swap_dir, "/dev/shm/kvpaged-swap-XXXXXX");
		ck_assert_ptr_nonnull(mkdtemp(swap_dir));
		check_io_mode(false);
	} else if (unshare(CLONE_NEWNS) == 0 &&
		   mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
		   mount("kvpaged-test", swap_dir, "ramfs", 0, "mode=0700") == 0) {
		ramfs = true;
		ck_assert(!dir_takes_o_direct(swap_dir));
		check_io_mode(false);
	} else {
		printf("buffered fallback not checked: /dev/shm takes O_DIRECT and ramfs cannot be "
		       "mounted here (%s)\n", strerror(errno));
	}
	if (ramfs)
		umount2(swap_dir, MNT_DETACH);
	remove_swap_dir();
}
END_TEST

/*
 * A tiny file system that fills up: the writes that fail are forgotten (counted as lost), a
 * parked sequence swapped there is recomputed on resume, and no error reaches the client.  A
 * real 64 KiB tmpfs when the test may mount one (root, in a mount namespace of its own);
 * otherwise a file size limit on the daemon, which fails writes the same way (EFBIG).
 */
START_TEST(test_full_file_system_falls_back_to_recompute)
{
	uint32_t t[128], ta[64], tb[128], rec = 0;
	struct kvp_table tab = { 0 }, tr = { 0 };
	struct kvp_client *c1, *c2;
	uint64_t s, sa;
	char out[16384];
	bool tmpfs = false;

	make_swap_dir();
	if (unshare(CLONE_NEWNS) == 0 && mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
	    mount("kvpaged-test", swap_dir, "tmpfs", 0, "size=64k") == 0)
		tmpfs = true;
	if (!tmpfs) {
		struct rlimit rl = { .rlim_cur = 64 * 1024, .rlim_max = RLIM_INFINITY };

		/* Inherited by the daemon: writes past 64 KiB fail with EFBIG, not a signal. */
		signal(SIGXFSZ, SIG_IGN);
		ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	}
	printf("full file system: %s\n", tmpfs ? "a 64 KiB tmpfs" : "RLIMIT_FSIZE 64 KiB");
	setup_pools(8, 0, 64, false);
	daemon_start(&d, pools);
	c1 = connect_ns(NULL, 0);
	c2 = connect_ns(NULL, 0);
	/* 40 blocks pushed into 64 KiB of 8 KiB slots: most of the writes fail. */
	for (uint32_t k = 0; k < 5; k++) {
		prompt(t, 128, 10000 + k * 1000);
		s = fill(c2, t, 128, (uint8_t)(0x80 + k * 8), &tab);
		ck_assert_int_eq(kvp_close(c2, s), 0);
	}
	prompt(ta, 64, 100);
	prompt(tb, 128, 3000);
	sa = fill(c1, ta, 64, 0x10, &tab);
	ck_assert_int_eq(kvp_park(c1, sa), 0);
	s = fill(c2, tb, 128, 0x30, &tab); /* a is swapped: its writes fail too */
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
		if (tier_int(out, "file", "lost") + tier_int(out, "file", "store_errors") >= 36)
			break;
		msleep(10);
	}
	ck_assert_int_ge(tier_int(out, "file", "lost") + tier_int(out, "file", "store_errors"), 36);
	ck_assert_int_eq(kvp_close(c2, s), 0);
	ck_assert_int_eq(kvp_resume(c1, sa, &rec, &tr), 0);
	ck_assert_uint_eq(rec, 64); /* nothing of a survived: all recomputed, no error */
	assert_verified(&d);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
	kvp_table_free(&tab);
	kvp_table_free(&tr);
	daemon_stop(&d);
	if (tmpfs)
		umount2(swap_dir, MNT_DETACH);
	remove_swap_dir();
}
END_TEST

/*
 * Opens and resumes over the socket read the swap files without holding the event loop: the
 * session waits (not read) while its reads are in flight and replies once they are in.  A
 * client that goes away meanwhile leaves nothing behind: its sequence is closed when its reads
 * are in.  (That the loop serves others meanwhile is a matter of timing; this checks that the
 * deferred path gives the same result and cleans up.)
 */
START_TEST(test_deferred_reads_and_a_client_gone)
{
	uint32_t ta[64], tb[128], cached = 0;
	struct kvp_table tab_a = { 0 }, tab_b = { 0 };
	Kvpaged__V1__Hello h = KVPAGED__V1__HELLO__INIT;
	Kvpaged__V1__Open o = KVPAGED__V1__OPEN__INIT;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_frame_header rh;
	struct kvp_client *c1, *c2;
	uint8_t *payload;
	uint64_t s;
	unsigned nfds;
	char out[16384];
	int fd, fds[4];
	long long before;

	make_swap_dir();
	setup_pools(8, 0, 64, false);
	daemon_start(&d, pools);
	prompt(ta, 64, 100);
	prompt(tb, 128, 3000);
	c1 = connect_ns(NULL, 0);
	c2 = connect_ns(NULL, 0);
	s = fill(c1, ta, 64, 0x10, &tab_a);
	ck_assert_int_eq(kvp_close(c1, s), 0);
	s = fill(c2, tb, 128, 0x30, &tab_b); /* a's 4 blocks go to the swap file */
	ck_assert_int_eq(kvp_close(c2, s), 0);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "demotions"), 4);

	/* A raw client: Hello, then an open of a's prompt, and gone without reading the reply. */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	memcpy(sa.sun_path, d.sock, strlen(d.sock) + 1);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	h.protocol_version = KVP_PROTOCOL_VERSION;
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__HELLO, 1, &h.base, NULL, 0),
			 0);
	ck_assert_int_eq(kvp_frame_recv(fd, 1 << 20, &rh, &payload, fds, 4, &nfds), 0);
	ck_assert_uint_eq(rh.type, KVPAGED__V1__MESSAGE_TYPE__WELCOME);
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	free(payload);
	o.tokens = ta;
	o.n_tokens = 64;
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__OPEN, 2, &o.base, NULL, 0),
			 0);
	close(fd);
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
		if (json_int(out, "sequences") == 0 && json_int(out, "sessions") == 2)
			break;
		msleep(10);
	}
	ck_assert_msg(json_int(out, "sequences") == 0 && json_int(out, "sessions") == 2, "%s", out);
	assert_verified(&d);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "promotions"), 4);
	ck_assert(daemon_log_has(&d, "reading 4 blocks from the swap files, the loop going on"));
	printf("client gone while loading: %s\n",
	       daemon_log_has(&d, "loaded after the session closed")
		       ? "its sequence was closed when its reads were in"
		       : "the reads were in before the daemon saw it go");

	/* Its reads were good: a's prompt is whole, now from the pool. */
	ck_assert_int_eq(kvp_open(c1, ta, 64, 0, 0, &s, &cached, &tab_a), 0);
	ck_assert_uint_eq(cached, 64);
	for (uint32_t i = 0; i < 4; i++)
		ck_assert_msg(block_is(c1, tab_a.blocks[i], (uint8_t)(0x10 + i)),
			      "block %u differs", i);
	ck_assert_int_eq(kvp_close(c1, s), 0);
	/* And once more from the file, through a client that waits for its reply. */
	s = fill(c2, tb, 128, 0x30, &tab_b);
	ck_assert_int_eq(kvp_close(c2, s), 0);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	before = tier_int(out, "file", "promotions");
	ck_assert_int_eq(kvp_open(c1, ta, 64, 0, 0, &s, &cached, &tab_a), 0);
	ck_assert_uint_eq(cached, 64);
	for (uint32_t i = 0; i < 4; i++)
		ck_assert(block_is(c1, tab_a.blocks[i], (uint8_t)(0x10 + i)));
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(tier_int(out, "file", "promotions"), before + 4);
	assert_verified(&d);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
	kvp_table_free(&tab_a);
	kvp_table_free(&tab_b);
	daemon_stop(&d);
	remove_swap_dir();
}
END_TEST

/* A raw session (rings of 8 entries, mapped): Hello done; *ret_ring gets the mapping. */
static int raw_ring_session(uint8_t **ret_ring, int fds[4])
{
	Kvpaged__V1__Hello h = KVPAGED__V1__HELLO__INIT;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_frame_header rh;
	uint8_t *payload;
	unsigned nfds;
	struct stat st;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	memcpy(sa.sun_path, d.sock, strlen(d.sock) + 1);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	h.protocol_version = KVP_PROTOCOL_VERSION;
	h.ring_entries = 8;
	h.ring_data_bytes = 4096;
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__HELLO, 1, &h.base, NULL, 0),
			 0);
	ck_assert_int_eq(kvp_frame_recv(fd, 1 << 20, &rh, &payload, fds, 4, &nfds), 0);
	ck_assert_uint_eq(rh.type, KVPAGED__V1__MESSAGE_TYPE__WELCOME);
	ck_assert_uint_eq(nfds, 4);
	free(payload);
	ck_assert_int_eq(fstat(fds[1], &st), 0);
	*ret_ring = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	ck_assert_ptr_ne(*ret_ring, MAP_FAILED);
	return fd;
}

/*
 * A session closed while its reads are in flight: it sends an OPEN of a prompt whose blocks
 * (12 MiB) are in the swap file, then breaks its ring's rules at once, so the daemon closes it
 * while the reads go on.  The sequence is then an orphan until they land, and is closed then;
 * nothing is left behind.  (Which way it went is printed: the daemon could, in principle, see
 * the doorbell first.)
 */
START_TEST(test_session_closed_while_loading)
{
	static char conf[1024];
	uint32_t ta[512], tb[512];
	struct kvp_table tab = { 0 };
	Kvpaged__V1__Open o = KVPAGED__V1__OPEN__INIT;
	struct kvp_ring_header *hdr;
	struct kvp_client *c1;
	uint8_t *ring;
	uint64_t s, one = 1;
	uint32_t cached = 0;
	char out[16384];
	int fd, fds[4];

	make_swap_dir();
	snprintf(swap_path, sizeof(swap_path), "%s/swap0", swap_dir);
	/* 512 KiB blocks: 8 layers, 8 heads of 128, bf16, 16 tokens. */
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 8\nkv_heads = 8\nhead_dim = 128\nelement_bytes = 2\n"
		 "block_tokens = 16\ncapacity_blocks = 40\nfile_tier_blocks = 96\nswap_files = %s\n",
		 swap_path);
	daemon_start(&d, conf);
	prompt(ta, 512, 100);
	prompt(tb, 512, 30000);
	c1 = connect_ns(NULL, 0);
	s = fill(c1, ta, 512, 0x10, &tab);
	ck_assert_int_eq(kvp_close(c1, s), 0);
	s = fill(c1, tb, 512, 0x60, &tab); /* a's last 24 blocks go to the swap file */
	ck_assert_int_eq(kvp_close(c1, s), 0);

	fd = raw_ring_session(&ring, fds);
	hdr = (struct kvp_ring_header *)ring;
	o.tokens = ta;
	o.n_tokens = 512;
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__OPEN, 2, &o.base, NULL, 0),
			 0);
	__atomic_store_n(&((struct kvp_ring_indices *)(ring + hdr->sq_off))->tail, 1000,
			 __ATOMIC_RELEASE);
	ck_assert_int_eq(write(fds[2], &one, sizeof(one)), 8);
	for (int i = 0; i < 300; i++) {
		ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
		if (json_int(out, "sequences") == 0 && json_int(out, "sessions") == 1)
			break;
		msleep(10);
	}
	ck_assert_msg(json_int(out, "sequences") == 0 && json_int(out, "sessions") == 1, "%s", out);
	printf("session closed while loading: %s\n",
	       daemon_log_has(&d, "loaded after the session closed")
		       ? "its sequence was an orphan until its reads were in"
	       : daemon_log_has(&d, "the loop going on")
		       ? "the reads were in before the daemon closed it"
		       : "the daemon closed it before it read the open");
	assert_verified(&d);
	/*
	 * a's prompt is whole again, every block as written (from the pool if the orphan's reads
	 * were taken, else from the file): nothing is written before it is checked.
	 */
	ck_assert_int_eq(kvp_open(c1, ta, 512, 0, 0, &s, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 512);
	for (uint32_t i = 0; i < 32; i++)
		ck_assert_msg(block_is(c1, tab.blocks[i], (uint8_t)(0x10 + i)), "block %u differs",
			      i);
	ck_assert_int_eq(kvp_close(c1, s), 0);
	assert_verified(&d);
	close(fd);
	for (int i = 0; i < 4; i++)
		close(fds[i]);
	kvp_disconnect(c1);
	kvp_table_free(&tab);
	daemon_stop(&d);
	remove_swap_dir();
}
END_TEST

/*
 * copy_thread = yes: the host tier's moves run on the backend's helper thread while the loop
 * goes on, as a GPU pool's do on its stream.  1 MiB blocks, so a swap of 24 of them is still
 * being copied when the reply is ready: the reply (socket) and the completion (ring) must wait
 * for the queue.  Each check reads the blocks last to first, so that a reply sent early would
 * meet the block the thread copies last before the thread got there.
 */
#define BIG_POOL                                                                                \
	"[pool main]\ncopy_thread = yes\nlayers = 4\nkv_heads = 8\nhead_dim = 128\n"             \
	"element_bytes = 2\nblock_tokens = 64\ncapacity_blocks = 40\nhost_tier_blocks = 128\n"

static void write_big(struct kvp_client *c, const uint32_t *blocks, uint32_t n, uint8_t tag)
{
	for (uint32_t i = 0; i < n; i++)
		write_block(c, blocks[i], (uint8_t)(tag + i));
}

static void assert_big(struct kvp_client *c, const uint32_t *blocks, uint32_t n, uint8_t tag,
		       const char *what)
{
	for (uint32_t i = n; i-- > 0;)
		ck_assert_msg(block_is(c, blocks[i], (uint8_t)(tag + i)),
			      "%s: block %u of %u differs", what, i, n);
}

START_TEST(test_replies_wait_for_queued_moves)
{
	static uint32_t ta[2048], tb[2048], table[32];
	struct kvp_table tab = { 0 };
	struct kvp_completion comp;
	struct kvp_client *c1, *c2, *r;
	struct kvp_op op;
	uint32_t cached = 0;
	uint64_t sa, sb;
	char out[16384];

	daemon_start(&d, BIG_POOL);
	prompt(ta, 2048, 100);
	prompt(tb, 2048, 50000);
	c1 = connect_ns(NULL, 0);
	c2 = connect_ns(NULL, 0);
	r = connect_ns(NULL, 64);

	/* a: 32 blocks, cached once closed. */
	ck_assert_int_eq(kvp_open(c1, ta, 2048, 0, 0, &sa, &cached, &tab), 0);
	ck_assert_uint_eq(tab.len, 32);
	write_big(c1, tab.blocks, 32, 0x10);
	ck_assert_int_eq(kvp_commit(c1, sa, 2048, &tab), 0);
	ck_assert_int_eq(kvp_close(c1, sa), 0);

	/*
	 * b needs 32 of the 40 blocks: 24 of a's go to the host tier, moved out by the thread
	 * while b's reply waits.  b writes its own bytes into them at once; had the reply gone
	 * early, those writes would race the move and a's copy in the host tier would be b's.
	 */
	ck_assert_int_eq(kvp_open(c2, tb, 2048, 0, 0, &sb, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 0);
	write_big(c2, tab.blocks, 32, 0x80);
	ck_assert_int_eq(kvp_commit(c2, sb, 2048, &tab), 0);
	ck_assert_int_eq(kvp_close(c2, sb), 0);

	/* a again over the socket: 24 blocks move in (b's go out first); read at once. */
	ck_assert_int_eq(kvp_open(c1, ta, 2048, 0, 0, &sa, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 2048);
	assert_big(c1, tab.blocks, 32, 0x10, "socket: a's prompt after its reply");
	ck_assert_int_eq(kvp_close(c1, sa), 0);

	/* b again over the rings: the completion is not shown until its blocks are in. */
	op = (struct kvp_op){ .opcode = KVP_OPEN, .user_data = 1, .tokens = tb, .ntokens = 2048,
			      .table_cap = 32, .table_out = table };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(r, &comp, 1, 1, 10000), 1);
	ck_assert_int_eq(comp.res, 0);
	ck_assert_uint_eq(comp.aux, 2048);
	ck_assert_uint_eq(comp.table_len, 32);
	assert_big(r, table, 32, 0x80, "ring: b's prompt after its completion");

	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_ge(tier_int(out, "host", "promotions"), 48);
	/* Whether a reply found the copies done already is the scheduler's business: shown only. */
	printf("copy_thread: %lld operations queued, %lld replies held, %lld loop waits\n",
	       json_int(out, "queued_ops"), json_int(out, "held_replies"),
	       json_int(out, "loop_waits"));
	ck_assert_int_gt(json_int(out, "queued_ops"), 0);
	assert_verified(&d);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
	kvp_disconnect(r);
	kvp_table_free(&tab);
	daemon_stop(&d);
}
END_TEST

/*
 * Long prompts back from the swap file, bytewise: 200 blocks each, more than a staging holds
 * (64), so that on a pool on a device (threaded.test's second pass) the socket's deferred
 * reads go through the load staging in chunks and the ring's reads through the staging in
 * chunks, each chunk moved in before the next is read.  On a pool in host memory the same
 * reads land in the blocks directly.
 */
START_TEST(test_long_prompts_back_from_the_swap_file)
{
	static uint32_t ta[3200], tb[3200], table[200];
	static char conf[1024];
	struct kvp_table tab = { 0 };
	struct kvp_completion comp;
	struct kvp_client *c, *r;
	struct kvp_op op;
	uint32_t cached = 0;
	uint64_t sa, sb;
	char out[16384];

	make_swap_dir();
	setup_pools(210, 0, 512, false);
	snprintf(conf, sizeof(conf), "%s", pools);
	daemon_start(&d, conf);
	prompt(ta, 3200, 100);
	prompt(tb, 3200, 90000);
	c = connect_ns(NULL, 0);
	r = connect_ns(NULL, 64);

	ck_assert_int_eq(kvp_open(c, ta, 3200, 0, 0, &sa, &cached, &tab), 0);
	ck_assert_uint_eq(tab.len, 200);
	write_big(c, tab.blocks, 200, 0x11);
	ck_assert_int_eq(kvp_commit(c, sa, 3200, &tab), 0);
	ck_assert_int_eq(kvp_close(c, sa), 0);
	ck_assert_int_eq(kvp_open(c, tb, 3200, 0, 0, &sb, &cached, &tab), 0); /* a goes down */
	write_big(c, tab.blocks, 200, 0x55);
	ck_assert_int_eq(kvp_commit(c, sb, 3200, &tab), 0);
	ck_assert_int_eq(kvp_close(c, sb), 0);

	/* a over the socket (deferred reads), then b over the rings (read within the call). */
	ck_assert_int_eq(kvp_open(c, ta, 3200, 0, 0, &sa, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 3200);
	assert_big(c, tab.blocks, 200, 0x11, "socket: a's prompt from the swap file");
	ck_assert_int_eq(kvp_close(c, sa), 0);
	op = (struct kvp_op){ .opcode = KVP_OPEN, .user_data = 2, .tokens = tb, .ntokens = 3200,
			      .table_cap = 200, .table_out = table };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(r, &comp, 1, 1, 10000), 1);
	ck_assert_int_eq(comp.res, 0);
	ck_assert_uint_eq(comp.aux, 3200);
	assert_big(r, table, 200, 0x55, "ring: b's prompt from the swap file");

	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_ge(tier_int(out, "file", "promotions"), 2 * 190);
	assert_verified(&d);
	kvp_disconnect(c);
	kvp_disconnect(r);
	kvp_table_free(&tab);
	daemon_stop(&d);
	remove_swap_dir();
}
END_TEST

/*
 * One ring batch that pushes a prompt down to the swap file and reads it back at once: a (40
 * blocks), then z (10), are cached in a pool of 60 with no host tier; the batch OPENs b (20
 * blocks), which evicts a's last 10 to the files, then OPENs a, which evicts z and reads those
 * 10 back.  On a pool on a device the demotions are still on their way through the store
 * staging when the second entry reads their slots, and it must wait for them (else it reads
 * what the slots held before, and a is recomputed).  On a pool in host memory they are written
 * at once.
 */
/* The pool of the push-down tests: 60 blocks of 512 bytes, host slots, 128 file slots, extra. */
static void pushdown_pool(unsigned host, const char *extra)
{
	make_swap_dir();
	setup_pools(60, host, 128, false);
	strncat(pools, extra, sizeof(pools) - strlen(pools) - 1);
	daemon_start(&d, pools);
}

static void ring_pushdown(unsigned host, const char *extra, const char *below)
{
	static uint32_t ta[640], tb[320], tz[160], table_a[40], table_b[20];
	struct kvp_table tab = { 0 };
	struct kvp_completion comp[2];
	struct kvp_client *c, *r;
	struct kvp_op ops[2];
	char out[16384];

	pushdown_pool(host, extra);
	prompt(ta, 640, 100);
	prompt(tb, 320, 70000);
	prompt(tz, 160, 90000);
	c = connect_ns(NULL, 0);
	r = connect_ns(NULL, 64);
	ck_assert_int_eq(kvp_close(c, fill(c, ta, 640, 0x21, &tab)), 0);
	ck_assert_int_eq(kvp_close(c, fill(c, tz, 160, 0x61, &tab)), 0);

	ops[0] = (struct kvp_op){ .opcode = KVP_OPEN, .user_data = 1, .tokens = tb, .ntokens = 320,
				  .table_cap = 20, .table_out = table_b };
	ops[1] = (struct kvp_op){ .opcode = KVP_OPEN, .user_data = 2, .tokens = ta, .ntokens = 640,
				  .table_cap = 40, .table_out = table_a };
	ck_assert_int_eq(kvp_submit(r, ops, 2), 2);
	ck_assert_int_eq(kvp_complete(r, comp, 2, 2, 10000), 2);
	ck_assert_int_eq(comp[0].res, 0);
	ck_assert_int_eq(comp[1].res, 0);
	ck_assert_uint_eq(comp[1].aux, 640);
	assert_big(r, table_a, 40, 0x21, "a read back in the batch that pushed it down");
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_ge(tier_int(out, below, "promotions"), 10);
	assert_verified(&d);
	kvp_disconnect(c);
	kvp_disconnect(r);
	kvp_table_free(&tab);
	daemon_stop(&d);
	remove_swap_dir();
}

START_TEST(test_ring_batch_reads_what_it_just_pushed_down)
{
	ring_pushdown(0, "", "file");
}
END_TEST

/*
 * The same push-down, with the read back over the socket from another session: the ring's
 * OPEN b pushes a's last 10 blocks to the files and, right behind it, a socket OPEN of a defers
 * its reads; on a pool on a device they must start only once those blocks' stores are handed to
 * the file tier.  (Had the socket open come first, a would still be whole in the pool: either
 * way it comes back whole.)
 */
static void socket_pushdown(unsigned host, const char *extra)
{
	static uint32_t ta[640], tb[320], tz[160], table_b[20];
	struct kvp_table tab = { 0 }, tab2 = { 0 };
	struct kvp_completion comp;
	struct kvp_client *c, *c2, *r;
	struct kvp_op op;
	uint32_t cached = 0;
	uint64_t sa;

	pushdown_pool(host, extra);
	prompt(ta, 640, 100);
	prompt(tb, 320, 70000);
	prompt(tz, 160, 90000);
	c = connect_ns(NULL, 0);
	c2 = connect_ns(NULL, 0);
	r = connect_ns(NULL, 64);
	ck_assert_int_eq(kvp_close(c, fill(c, ta, 640, 0x21, &tab)), 0);
	ck_assert_int_eq(kvp_close(c, fill(c, tz, 160, 0x61, &tab)), 0);

	op = (struct kvp_op){ .opcode = KVP_OPEN, .user_data = 1, .tokens = tb, .ntokens = 320,
			      .table_cap = 20, .table_out = table_b };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_open(c2, ta, 640, 0, 0, &sa, &cached, &tab2), 0);
	ck_assert_uint_eq(cached, 640);
	assert_big(c2, tab2.blocks, 40, 0x21, "a over the socket behind the push-down");
	ck_assert_int_eq(kvp_complete(r, &comp, 1, 1, 10000), 1);
	ck_assert_int_eq(comp.res, 0);
	assert_verified(&d);
	kvp_disconnect(c);
	kvp_disconnect(c2);
	kvp_disconnect(r);
	kvp_table_free(&tab);
	kvp_table_free(&tab2);
	daemon_stop(&d);
	remove_swap_dir();
}

START_TEST(test_socket_read_waits_for_a_pushdown)
{
	socket_pushdown(0, "");
}
END_TEST

/*
 * A pool on a device whose host tier is plain memory (host_tier_plain = yes): its blocks go
 * down through the staging and a CPU copy, and come back the same way, within a ring batch and
 * behind a socket open.  Only where the daemon takes a GPU pool's paths here (threaded.test's
 * second pass: backend = auto falls back to the threaded host backend, which poses as a device).
 */
START_TEST(test_plain_host_tier_as_on_a_device)
{
	static const char plain[] = "backend = auto\nbackend_module = /nonexistent/kvpaged-cuda.so\n"
				    "copy_thread = yes\nhost_tier_plain = yes\n";
	ring_pushdown(20, plain, "host");
	socket_pushdown(20, plain);
}
END_TEST

int main(void)
{
	const char *device = getenv("KVPAGED_TEST_DEVICE_POOL");
	Suite *s = suite_create("tiers");
	TCase *tc = tcase_create("tiers");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_swap_through_host_and_file);
	tcase_add_test(tc, test_corrupt_swap_file_is_recomputed);
	tcase_add_test(tc, test_persistence_across_sigkill);
	tcase_add_test(tc, test_persistence_across_sigterm);
	tcase_add_test(tc, test_unsafe_swap_file_is_refused);
	tcase_add_test(tc, test_forged_slot_is_not_served);
	tcase_add_test(tc, test_bandwidth_measured_in_an_unnamed_file);
	tcase_add_test(tc, test_swap_file_io_mode);
	tcase_add_test(tc, test_full_file_system_falls_back_to_recompute);
	tcase_add_test(tc, test_deferred_reads_and_a_client_gone);
	tcase_add_test(tc, test_session_closed_while_loading);
	tcase_add_test(tc, test_replies_wait_for_queued_moves);
	tcase_add_test(tc, test_long_prompts_back_from_the_swap_file);
	tcase_add_test(tc, test_ring_batch_reads_what_it_just_pushed_down);
	tcase_add_test(tc, test_socket_read_waits_for_a_pushdown);
	/* Only as on a device: elsewhere the case would pass without having run. */
	if (device && !strcmp(device, "1"))
		tcase_add_test(tc, test_plain_host_tier_as_on_a_device);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
