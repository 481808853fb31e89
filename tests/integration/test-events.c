/* SPDX-License-Identifier: MIT */
/*
 * The KV event stream against the real daemon, read by a subscriber written as a router would
 * write one (events-sub.py: python3-zmq and python3-msgpack, decoding by vLLM's schema), in
 * both formats: every committed full block announced once with its tokens and block_size, its
 * parent announced before it; a cache hit announces nothing; a block pushed out of the pool
 * into the swap files is BlockStored on STORAGE and BlockRemoved on CPU; drop-cache removes
 * everything and ends with AllBlocksCleared; seq is contiguous within one epoch (seq >> 32);
 * the replay socket returns the first batch (AllBlocksCleared, sent before anyone listened)
 * and every batch seen live, the same; a namespace not in events_namespaces never appears.
 * Skipped (77) when /usr/bin/python3 cannot import zmq and msgpack.
 */
#include <json-c/json.h>
#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include "tests/integration/harness.h"
#include "tests/redis-fixture.h" /* free_port */

#define BT 16

static struct daemon d;
static char ep[192], rep_ep[192], script[512];
/* EVENTS_SUB_CURVE for the next subscriber started, if any. */
static const char *sub_curve;

/* A subscriber process and what it printed, read line by line. */
struct sub {
	pid_t pid;
	int fd;
	char buf[1 << 20];
	size_t len;
};

/* The next line the subscriber printed (without its newline), waiting up to timeout_ms. */
static bool read_line(struct sub *s, char *line, size_t cap, int timeout_ms)
{
	for (;;) {
		char *nl = memchr(s->buf, '\n', s->len);
		struct pollfd pfd = { .fd = s->fd, .events = POLLIN };
		ssize_t n;

		if (nl) {
			size_t k = (size_t)(nl - s->buf);

			ck_assert_uint_lt(k, cap);
			memcpy(line, s->buf, k);
			line[k] = '\0';
			memmove(s->buf, nl + 1, s->len - k - 1);
			s->len -= k + 1;
			return true;
		}
		ck_assert_uint_lt(s->len, sizeof(s->buf));
		if (poll(&pfd, 1, timeout_ms) <= 0)
			return false;
		n = read(s->fd, s->buf + s->len, sizeof(s->buf) - s->len);
		if (n <= 0)
			return false;
		s->len += (size_t)n;
	}
}

/* Runs argv with its stdout to be read by read_line. */
static void spawn(struct sub *s, char *const argv[])
{
	int fds[2];

	ck_assert_int_eq(pipe2(fds, O_CLOEXEC), 0);
	s->pid = fork();
	ck_assert_int_ge(s->pid, 0);
	if (s->pid == 0) {
		dup2(fds[1], 1);
		if (sub_curve)
			setenv("EVENTS_SUB_CURVE", sub_curve, 1);
		execv(argv[0], argv);
		_exit(127);
	}
	close(fds[1]);
	s->fd = fds[0];
	s->len = 0;
}

static void sub_start(struct sub *s, const char *mode, const char *endpoint, const char *arg)
{
	char *argv[] = { "/usr/bin/python3", script, (char *)mode, (char *)endpoint, (char *)arg,
			 NULL };
	char line[64];

	spawn(s, argv);
	if (strcmp(mode, "replay")) {
		ck_assert_msg(read_line(s, line, sizeof(line), 10000), "the subscriber did not start");
		ck_assert_str_eq(line, "ready");
	}
}

static void sub_stop(struct sub *s)
{
	int status;

	kill(s->pid, SIGTERM);
	waitpid(s->pid, &status, 0);
	close(s->fd);
}

/* The next batch the subscriber printed, or NULL after timeout_ms without one. */
static json_object *next_batch(struct sub *s, int timeout_ms)
{
	static char line[1 << 20];
	json_object *j;

	if (!read_line(s, line, sizeof(line), timeout_ms) || !strcmp(line, "end"))
		return NULL;
	j = json_tokener_parse(line);
	ck_assert_msg(j != NULL, "not JSON: %s", line);
	return j;
}

static json_object *get(json_object *o, const char *k)
{
	json_object *v = NULL;

	ck_assert_msg(json_object_object_get_ex(o, k, &v), "no %s in %s", k,
		      json_object_to_json_string(o));
	return v;
}

/* What the live subscriber has seen so far. */
#define MAX_BATCHES 256
#define MAX_BLOCKS 256
struct seen {
	json_object *batch[MAX_BATCHES];
	uint32_t nbatch;
	/* Blocks announced at each medium and not removed since: hash hex, its tokens. */
	char at[3][MAX_BLOCKS][17];
	uint32_t tokens[3][MAX_BLOCKS][BT];
	uint32_t nat[3];
	uint32_t stored[3], removed[3], cleared;
	char fmt[8];
};

static int medium(const char *m)
{
	return !strcmp(m, "GPU") ? 0 : !strcmp(m, "CPU") ? 1 : 2;
}

static int find(const struct seen *w, int m, const char *h)
{
	for (uint32_t i = 0; i < w->nat[m]; i++)
		if (!strcmp(w->at[m][i], h))
			return (int)i;
	return -1;
}

static bool anywhere(const struct seen *w, const char *h)
{
	return find(w, 0, h) >= 0 || find(w, 1, h) >= 0 || find(w, 2, h) >= 0;
}

static void seen_free(struct seen *w)
{
	for (uint32_t i = 0; i < w->nbatch; i++)
		json_object_put(w->batch[i]);
	w->nbatch = 0;
}

/* Applies one batch to what is known, checking the stream's rules as a router relies on them. */
static void apply(struct seen *w, json_object *b)
{
	json_object *evs = get(b, "events");

	ck_assert_str_eq(json_object_get_string(get(b, "topic")), "kv@test@tiny");
	if (w->nbatch) {
		uint64_t prev = (uint64_t)json_object_get_int64(get(w->batch[w->nbatch - 1], "seq"));
		uint64_t seq = (uint64_t)json_object_get_int64(get(b, "seq"));

		ck_assert_msg(seq == prev + 1, "seq %llx after %llx", (unsigned long long)seq,
			      (unsigned long long)prev);
	}
	ck_assert_uint_lt(w->nbatch, MAX_BATCHES);
	w->batch[w->nbatch++] = b;
	for (size_t i = 0; i < json_object_array_length(evs); i++) {
		json_object *ev = json_object_array_get_idx(evs, i), *hs;
		const char *type = json_object_get_string(get(ev, "type"));
		int m;

		ck_assert_str_eq(json_object_get_string(get(ev, "format")), w->fmt);
		if (!strcmp(type, "AllBlocksCleared")) {
			memset(w->nat, 0, sizeof(w->nat));
			w->cleared++;
			continue;
		}
		hs = get(ev, "block_hashes");
		m = medium(json_object_get_string(get(ev, "medium")));
		if (!strcmp(type, "BlockRemoved")) {
			for (size_t k = 0; k < json_object_array_length(hs); k++) {
				const char *h = json_object_get_string(json_object_array_get_idx(hs, k));
				int at = find(w, m, h);

				ck_assert_msg(at >= 0, "BlockRemoved of %s, never stored there", h);
				w->nat[m]--;
				memmove(w->at[m][at], w->at[m][w->nat[m]], 17);
				memcpy(w->tokens[m][at], w->tokens[m][w->nat[m]], sizeof(w->tokens[m][0]));
				w->removed[m]++;
			}
			continue;
		}
		ck_assert_str_eq(type, "BlockStored");
		ck_assert_int_eq(json_object_get_int(get(ev, "block_size")), BT);
		{
			json_object *parent = get(ev, "parent_block_hash"), *toks = get(ev, "token_ids");

			/* A parent is always a block announced before. */
			if (parent)
				ck_assert_msg(anywhere(w, json_object_get_string(parent)),
					      "parent %s not announced", json_object_get_string(parent));
			for (size_t k = 0; k < json_object_array_length(hs); k++) {
				const char *h = json_object_get_string(json_object_array_get_idx(hs, k));

				ck_assert_msg(find(w, m, h) < 0, "%s stored twice at one medium", h);
				ck_assert_uint_lt(w->nat[m], MAX_BLOCKS);
				snprintf(w->at[m][w->nat[m]], 17, "%s", h);
				for (uint32_t t = 0; t < BT; t++)
					w->tokens[m][w->nat[m]][t] = (uint32_t)json_object_get_int64(
						json_object_array_get_idx(toks, k * BT + t));
				w->nat[m]++;
				w->stored[m]++;
			}
		}
	}
}

/* Reads batches until cond holds (or 5 s pass: a failure). */
#define UNTIL(s, w, cond)                                                                          \
	do {                                                                                       \
		uint64_t t0_ = (uint64_t)time(NULL);                                               \
		while (!(cond)) {                                                                  \
			json_object *b_ = next_batch(s, 200);                                      \
			ck_assert_msg(b_ || (uint64_t)time(NULL) - t0_ < 5, "not seen: %s", #cond); \
			if (b_)                                                                    \
				apply(w, b_);                                                      \
		}                                                                                  \
	} while (0)

/* Reads whatever comes in ms. */
static void drain(struct sub *s, struct seen *w, int ms)
{
	json_object *b;

	while ((b = next_batch(s, ms)))
		apply(w, b);
}

/* Whether the tokens t (n full blocks) are announced at medium m, block by block. */
static uint32_t blocks_at(const struct seen *w, int m, const uint32_t *t, uint32_t nblocks)
{
	uint32_t found = 0;

	for (uint32_t b = 0; b < nblocks; b++)
		for (uint32_t i = 0; i < w->nat[m]; i++)
			if (!memcmp(w->tokens[m][i], t + b * BT, sizeof(uint32_t) * BT)) {
				found++;
				break;
			}
	return found;
}

static bool token_seen(const struct seen *w, uint32_t tok)
{
	for (int m = 0; m < 3; m++)
		for (uint32_t i = 0; i < w->nat[m]; i++)
			for (uint32_t t = 0; t < BT; t++)
				if (w->tokens[m][i][t] == tok)
					return true;
	return false;
}

/* Stops the daemon and removes what a test made in dir (swap file, sockets) and the daemon's. */
static void stop_and_clean(const char *dir)
{
	char swap[192];

	daemon_stop(&d);
	snprintf(swap, sizeof(swap), "%s/swap", dir);
	unlink(swap);
	unlink(ep + 6);
	unlink(rep_ep + 6);
	rmdir(dir); /* best effort: the file tier may leave more (its persisted state) */
	daemon_remove_files(&d);
}

static void commit(struct kvp_client *c, const uint32_t *t, uint32_t n)
{
	struct kvp_table tab = { 0 };
	uint32_t cached = 0;
	uint64_t s;

	ck_assert_int_eq(kvp_open(c, t, n, 0, 0, &s, &cached, &tab), 0);
	ck_assert_int_eq(kvp_commit(c, s, n, &tab), 0);
	ck_assert_int_eq(kvp_close(c, s), 0);
	kvp_table_free(&tab);
}

START_TEST(stream)
{
	static const char *const formats[] = { "map", "array" };
	const char *fmt = formats[_i];
	static struct seen w;
	static struct sub live, rep;
	char dir[] = "/tmp/kvpaged-events-XXXXXX";
	struct kvp_client *c, *other;
	uint32_t a[3 * BT + 1], o[2 * BT], x[3 * BT];
	char conf[2048], out[4096], swap[160];
	json_object *b;
	uint32_t nrep = 0;

	memset(&w, 0, sizeof(w));
	snprintf(w.fmt, sizeof(w.fmt), "%s", fmt);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ep, sizeof(ep), "ipc://%s/events", dir);
	snprintf(rep_ep, sizeof(rep_ep), "ipc://%s/events-replay", dir);
	snprintf(swap, sizeof(swap), "%s/swap", dir);
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = 8\nfile_tier_blocks = 64\nswap_files = %s\n"
		 "namespace = shared\nevents_endpoint = %s\nevents_replay_endpoint = %s\n"
		 "events_topic = kv@test@tiny\nevents_format = %s\nevents_namespaces = shared\n"
		 "events_batch_ms = 5\n",
		 BT, swap, ep, rep_ep, fmt);
	daemon_start(&d, conf);
	daemon_copy_ctl(&d);
	sub_start(&live, "listen", ep, NULL);
	msleep(300); /* a SUB's subscription reaches the PUB after its connect */
	c = connect_ns(NULL, 0);
	other = connect_ns("other", 0);

	/* A commit: its three full blocks, in order, with their tokens; the fourth is partial. */
	prompt(a, 3 * BT + 1, 1000);
	commit(c, a, 3 * BT + 1);
	UNTIL(&live, &w, w.stored[1] == 3);
	ck_assert_uint_eq(blocks_at(&w, 1, a, 3), 3);
	/* Another namespace, not listed: never announced. */
	prompt(o, 2 * BT, 5000);
	commit(other, o, 2 * BT);
	/* A hit announces nothing. */
	commit(c, a, 3 * BT + 1);
	drain(&live, &w, 300);
	ck_assert_uint_eq(w.stored[1], 3);
	ck_assert(!token_seen(&w, o[0]));

	/* Out of the pool (eight blocks) into the swap files: STORAGE, and gone from CPU. */
	for (uint32_t i = 0; i < 3; i++) {
		prompt(x, 3 * BT, 20000 + 1000 * i);
		commit(c, x, 3 * BT);
	}
	UNTIL(&live, &w, blocks_at(&w, 2, a, 3) == 3);
	ck_assert_uint_eq(blocks_at(&w, 1, a, 3), 0);
	ck_assert_uint_ge(w.removed[1], 3);

	/* drop-cache: everything removed, then AllBlocksCleared. */
	ck_assert_int_eq(ctl(&d, "drop-cache", out, sizeof(out)), 0);
	UNTIL(&live, &w, w.cleared == 1);
	ck_assert_uint_eq(w.nat[1] + w.nat[2], 0);
	ck_assert(!token_seen(&w, o[0]));
	/* The counters say the same: every batch seen here was sent, nothing dropped. */
	{
		static char st[65536];

		ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
		ck_assert_int_ge(json_int(st, "batches"), w.nbatch);
		ck_assert_int_eq(json_int(st, "dropped"), 0);
		ck_assert_int_eq(json_int(st, "namespaces_announced"), 1);
		ck_assert_ptr_nonnull(strstr(st, fmt));
		char *argv[] = { "kvpagedctl", "--socket", d.admin, "metrics", NULL };

		ck_assert_int_eq(run_output(d.ctl, argv, st, sizeof(st)), 0);
		ck_assert_msg(strstr(st, "kvpaged_events_batches_total{pool=\"main\"} ") &&
				      strstr(st, "kvpaged_events_dropped_total{pool=\"main\"} 0\n") &&
				      strstr(st, "# TYPE kvpaged_events_queued gauge"),
			      "%s", st);
	}

	/*
	 * Replay from 0: the first batch, sent at start before anyone listened, is
	 * AllBlocksCleared alone; every batch seen live comes back the same.
	 */
	sub_start(&rep, "replay", rep_ep, "0");
	while ((b = next_batch(&rep, 5000))) {
		uint64_t seq = (uint64_t)json_object_get_int64(get(b, "seq"));
		json_object *evs = get(b, "events");

		if (!nrep++) {
			ck_assert_uint_eq(json_object_array_length(evs), 1);
			ck_assert_str_eq(json_object_get_string(get(json_object_array_get_idx(evs, 0),
								     "type")),
					 "AllBlocksCleared");
			/* The epoch: the start's time, in the upper half of seq. */
			ck_assert_uint_le(seq >> 32, (uint64_t)time(NULL));
			ck_assert_uint_gt(seq >> 32, (uint64_t)time(NULL) - 600);
		}
		for (uint32_t i = 0; i < w.nbatch; i++)
			if ((uint64_t)json_object_get_int64(get(w.batch[i], "seq")) == seq)
				ck_assert_str_eq(
					json_object_to_json_string(evs),
					json_object_to_json_string(get(w.batch[i], "events")));
		json_object_put(b);
	}
	ck_assert_uint_ge(nrep, w.nbatch + 1);
	sub_stop(&rep);

	other = kvp_disconnect(other);
	c = kvp_disconnect(c);
	sub_stop(&live);
	seen_free(&w);
	stop_and_clean(dir);
}
END_TEST

/*
 * A queue too short for one commit (events_queue = 16, a commit of 40 blocks): what does not fit
 * is dropped, counted, and the next batch's seq skips one, so a subscriber sees the gap; the
 * daemon serves on.  The client's namespace is narrowed (shared/tenant-a): "shared" with a slash and a star lists it.
 */
START_TEST(queue_full)
{
	static struct seen w;
	static struct sub live;
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[1024];
	static char st[65536];
	uint32_t t[40 * BT], u[2 * BT];
	struct kvp_client *c;
	bool gap = false;
	json_object *b;
	uint64_t prev = 0;

	memset(&w, 0, sizeof(w));
	snprintf(w.fmt, sizeof(w.fmt), "map");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ep, sizeof(ep), "ipc://%s/events", dir);
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = 64\nnamespace = shared\n"
		 "events_endpoint = %s\nevents_namespaces = shared/*\nevents_queue = 16\n"
		 "events_batch_ms = 200\nevents_topic = kv@test@tiny\n",
		 BT, ep);
	daemon_start(&d, conf);
	daemon_copy_ctl(&d);
	sub_start(&live, "listen", ep, NULL);
	msleep(300);
	/* The start's batch out first, so that the queue is empty when the commit comes. */
	for (int i = 0; i < 100; i++) {
		ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
		if (json_int(st, "batches") >= 1)
			break;
		msleep(50);
	}
	ck_assert_int_ge(json_int(st, "batches"), 1);
	/* A narrowed namespace: events_namespaces lists shared and its narrowings. */
	c = connect_ns("tenant-a", 0);
	/* A batch the subscriber surely sees (the start's went out before it may have listened). */
	prompt(u, BT, 70000);
	commit(c, u, BT);
	for (bool stored = false; !stored;) {
		b = next_batch(&live, 5000);
		ck_assert_msg(b, "the subscriber did not see the block stored");
		prev = (uint64_t)json_object_get_int64(get(b, "seq"));
		stored = !strcmp(json_object_get_string(get(json_object_array_get_idx(
					 get(b, "events"), 0), "type")),
				 "BlockStored");
		json_object_put(b);
	}
	prompt(t, 40 * BT, 1000);
	commit(c, t, 40 * BT);
	prompt(u, 2 * BT, 90000);
	msleep(300);
	commit(c, u, 2 * BT);
	/* The batches as they come: one seq skipped, then the next commit's blocks. */
	while ((b = next_batch(&live, 2000))) {
		uint64_t seq = (uint64_t)json_object_get_int64(get(b, "seq"));

		gap |= prev && seq > prev + 1;
		prev = seq;
		json_object_put(b);
		if (gap)
			break;
	}
	ck_assert_msg(gap, "no seq was skipped");
	ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
	ck_assert_int_eq(json_int(st, "dropped"), 40 - 16);
	c = kvp_disconnect(c);
	sub_stop(&live);
	stop_and_clean(dir);
}
END_TEST

/*
 * With file_tier_persist, the blocks a restart finds in the swap files (a chain of seven, read
 * back in whatever order the reads complete) are announced on STORAGE, parents first,
 * right after the start's AllBlocksCleared, before any session attaches: the listed names'
 * salts are known from the configuration.
 */
START_TEST(persisted)
{
	static struct seen w;
	static struct sub rep;
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[1024], swap[160];
	uint32_t a[7 * BT];
	struct kvp_client *c;
	json_object *b;

	memset(&w, 0, sizeof(w));
	snprintf(w.fmt, sizeof(w.fmt), "map");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ep, sizeof(ep), "ipc://%s/events", dir);
	snprintf(rep_ep, sizeof(rep_ep), "ipc://%s/events-replay", dir);
	snprintf(swap, sizeof(swap), "%s/swap", dir);
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = 8\nfile_tier_blocks = 64\n"
		 "swap_files = %s\nfile_tier_persist = yes\nnamespace = shared\n"
		 "events_endpoint = %s\nevents_replay_endpoint = %s\n"
		 "events_topic = kv@test@tiny\nevents_namespaces = shared\n",
		 BT, swap, ep, rep_ep);
	daemon_start(&d, conf);
	c = connect_ns(NULL, 0);
	prompt(a, 7 * BT, 3000);
	commit(c, a, 7 * BT);
	c = kvp_disconnect(c);
	daemon_stop(&d); /* writes the pool's blocks to the files */
	daemon_remove_files(&d);

	daemon_start(&d, conf);
	msleep(300); /* the start's batch sent */
	sub_start(&rep, "replay", rep_ep, "0");
	while ((b = next_batch(&rep, 5000))) {
		/* Replayed batches are not checked for topic or contiguity: applied for content. */
		json_object *evs = get(b, "events");

		for (size_t i = 0; i < json_object_array_length(evs); i++) {
			json_object *one = json_object_new_object(), *arr = json_object_new_array();

			json_object_array_add(arr, json_object_get(json_object_array_get_idx(evs, i)));
			json_object_object_add(one, "events", arr);
			json_object_object_add(one, "topic", json_object_new_string("kv@test@tiny"));
			json_object_object_add(one, "seq", json_object_new_int64((int64_t)w.nbatch));
			apply(&w, one);
		}
		json_object_put(b);
	}
	sub_stop(&rep);
	ck_assert_uint_eq(w.cleared, 1);
	ck_assert_uint_eq(blocks_at(&w, 2, a, 7), 7);
	seen_free(&w);
	stop_and_clean(dir);
}
END_TEST

/*
 * CURVE on tcp://: the server's key pair (A), one allowed client key (B) and one that is not
 * (C), made with zmq.curve_keypair().  The allowed subscriber receives and replays; the wrong
 * key is refused by the ZAP handler (counted) and a plain subscriber fails the handshake:
 * neither receives a batch.  kvpagedctl events tails it with the allowed key (JSON and text), and
 * without a key says which option it needs.
 */
#define KEY_A_PUB "}#VDY{UUZMR%vb)wpQ]$&:9th6d$#K?y2P^pMJ7V"
#define KEY_A_SEC "O4awP4Dndl5Jpu:Srh&U&axGlGU(8>NdgHZ>R4?Q"
#define KEY_B_PUB "lyQ2IlC9[Jq8sJ*t}vj%Uf=PT2r}QovDOFm2*quD"
#define KEY_B_SEC "SQ&LM*JKl{M>$%MeIypg@Tu>*Re<PS/VAvwUE3S4"
#define KEY_C_PUB "nAnG.a0{!iWso/N!:qn.yimr1OrP^5f-4ReTI:ay"
#define KEY_C_SEC "]<4Pb06X2bKo944yIiS=UkPGk43zL-+G^N:+G<vW"

static void write_key(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

START_TEST(curve)
{
	static struct seen w;
	static struct sub good, wrong, plain, rep, tail, tail_text;
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[2048], sec[160], allowed[160],
	     client_key[160];
	static char st[65536];
	uint32_t a[2 * BT];
	struct kvp_client *c;
	json_object *b;
	uint32_t nrep = 0;

	memset(&w, 0, sizeof(w));
	snprintf(w.fmt, sizeof(w.fmt), "map");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sec, sizeof(sec), "%s/events.key", dir);
	snprintf(allowed, sizeof(allowed), "%s/allowed", dir);
	write_key(sec, KEY_A_SEC "\n");
	write_key(allowed, "# the router\n" KEY_B_PUB "\n");
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", free_port());
	snprintf(rep_ep, sizeof(rep_ep), "tcp://127.0.0.1:%u", free_port());
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = 16\nnamespace = shared\n"
		 "events_endpoint = %s\nevents_replay_endpoint = %s\n"
		 "events_curve_secret_key_file = %s\nevents_curve_allowed_keys_file = %s\n"
		 "events_topic = kv@test@tiny\nevents_namespaces = shared\nevents_batch_ms = 5\n",
		 BT, ep, rep_ep, sec, allowed);
	daemon_start(&d, conf);
	daemon_copy_ctl(&d);
	ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
	ck_assert_msg(strstr(st, KEY_A_PUB), "the server's public key is not in stats: %s", st);

	sub_curve = KEY_A_PUB " " KEY_B_PUB " " KEY_B_SEC;
	sub_start(&good, "listen", ep, NULL);
	sub_curve = KEY_A_PUB " " KEY_C_PUB " " KEY_C_SEC;
	sub_start(&wrong, "listen", ep, NULL);
	sub_curve = NULL;
	sub_start(&plain, "listen", ep, NULL);
	/* kvpagedctl events, with this client's key and without. */
	{
		char cmd[1024], out[4096];
		char *argv[] = { "/bin/sh", "-c", cmd, NULL };

		snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' events 2>&1", d.ctl, d.admin);
		ck_assert_int_eq(run_output("/bin/sh", argv, out, sizeof(out)), 1);
		ck_assert_msg(strstr(out, "--curve-key") && strstr(out, KEY_A_PUB), "%s", out);
	}
	snprintf(client_key, sizeof(client_key), "%s/client.key", dir);
	write_key(client_key, KEY_B_SEC);
	{
		char *argv[] = { d.ctl, "--socket", d.admin, "events", "--curve-key", client_key,
				 "--count", "1", "--json", NULL };
		char *text_argv[] = { d.ctl, "--socket", d.admin, "events", "--curve-key",
				      client_key, "--count", "1", NULL };

		spawn(&tail, argv);
		spawn(&tail_text, text_argv);
	}
	msleep(500);
	c = connect_ns(NULL, 0);
	prompt(a, 2 * BT, 4000);
	commit(c, a, 2 * BT);
	UNTIL(&good, &w, w.stored[1] == 2);
	/* The tails: the commit's batch, decoded, then they exit. */
	{
		static char line[65536];

		ck_assert(read_line(&tail, line, sizeof(line), 5000));
		ck_assert_msg(strstr(line, "\"type\":\"BlockStored\"") &&
				      strstr(line, "\"topic\":\"kv@test@tiny\"") &&
				      strstr(line, "\"medium\":\"CPU\"") &&
				      strstr(line, "\"token_ids\":[4000,4007,"),
			      "%s", line);
		ck_assert_int_eq(wait_child(tail.pid), 0);
		close(tail.fd);
		ck_assert(read_line(&tail_text, line, sizeof(line), 5000));
		ck_assert_msg(strstr(line, " BlockStored CPU 2 blocks ") &&
				      strstr(line, "(32 tokens)"),
			      "%s", line);
		ck_assert_int_eq(wait_child(tail_text.pid), 0);
		close(tail_text.fd);
	}
	ck_assert_uint_eq(blocks_at(&w, 1, a, 2), 2);
	/* The others had as long and longer: nothing. */
	msleep(500);
	ck_assert_ptr_null(next_batch(&wrong, 200));
	ck_assert_ptr_null(next_batch(&plain, 200));
	ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
	ck_assert_int_ge(json_int(st, "refused"), 1);
	ck_assert_int_eq(json_int(st, "subscribers"), 1);

	/* Replay over CURVE, the allowed key: the start's batch and the commit's. */
	sub_curve = KEY_A_PUB " " KEY_B_PUB " " KEY_B_SEC;
	sub_start(&rep, "replay", rep_ep, "0");
	sub_curve = NULL;
	while ((b = next_batch(&rep, 5000))) {
		nrep++;
		json_object_put(b);
	}
	ck_assert_uint_ge(nrep, 2);
	sub_stop(&rep);

	c = kvp_disconnect(c);
	sub_stop(&good);
	sub_stop(&wrong);
	sub_stop(&plain);
	seen_free(&w);
	unlink(sec);
	unlink(allowed);
	unlink(client_key);
	stop_and_clean(dir);
}
END_TEST

/*
 * A subscriber that never reads (a receive queue of one message, a 4 KiB socket buffer) and one
 * that does, with a send high-water mark of 32 batches and batches of about 60 KB: the batches
 * the stalled one cannot take are counted (slow), the reader gets every batch (seq contiguous),
 * nothing is dropped from the queue, and the daemon serves on (a cache hit after it all).
 */
#define SLOW_BT 256
#define SLOW_BLOCKS 48
START_TEST(slow_subscriber)
{
	static struct sub stall, reader;
	static uint32_t t[SLOW_BLOCKS * SLOW_BT];
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[1024];
	static char st[65536];
	struct kvp_client *c;
	struct kvp_table tab = { 0 };
	uint32_t cached = 0, nread = 0;
	uint64_t prev = 0, s;
	json_object *b;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ep, sizeof(ep), "ipc://%s/events", dir);
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = %u\nnamespace = shared\n"
		 "events_endpoint = %s\nevents_namespaces = shared\nevents_hwm = 32\n"
		 "events_batch_ms = 1\nevents_topic = kv@test@tiny\n",
		 SLOW_BT, 2 * SLOW_BLOCKS, ep);
	daemon_start(&d, conf);
	daemon_copy_ctl(&d);
	sub_start(&stall, "stall", ep, NULL);
	sub_start(&reader, "listen", ep, NULL);
	msleep(500);
	c = connect_ns(NULL, 0);
	/* 96 commits of 48 blocks, each its own batch or two: some 6 MB of events. */
	for (uint32_t i = 0; i < 96; i++) {
		prompt(t, SLOW_BLOCKS * SLOW_BT, 100000 * (i + 1));
		commit(c, t, SLOW_BLOCKS * SLOW_BT);
		msleep(2);
	}
	/* The last prompt is still cached: the daemon served all along. */
	ck_assert_int_eq(kvp_open(c, t, SLOW_BLOCKS * SLOW_BT, 0, 0, &s, &cached, &tab), 0);
	ck_assert_uint_ge(cached, (SLOW_BLOCKS - 1) * SLOW_BT);
	ck_assert_int_eq(kvp_close(c, s), 0);
	kvp_table_free(&tab);
	ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
	ck_assert_int_gt(json_int(st, "slow"), 0);
	ck_assert_int_eq(json_int(st, "dropped"), 0);
	ck_assert_int_eq(json_int(st, "subscribers"), 2);
	/* The reader: every batch since it came, in order, up to the last one sent. */
	for (;;) {
		uint64_t seq;

		b = next_batch(&reader, 5000);
		ck_assert_msg(b, "the reader got %u batches, up to seq %llx, not %llx", nread,
			      (unsigned long long)prev, json_int(st, "next_seq") - 1);
		seq = (uint64_t)json_object_get_int64(get(b, "seq"));
		json_object_put(b);
		ck_assert_msg(!prev || seq == prev + 1, "seq %llx after %llx",
			      (unsigned long long)seq, (unsigned long long)prev);
		prev = seq;
		nread++;
		if (seq + 1 == (uint64_t)json_int(st, "next_seq"))
			break;
	}
	c = kvp_disconnect(c);
	sub_stop(&stall);
	sub_stop(&reader);
	stop_and_clean(dir);
}
END_TEST

/* The daemon's threads named name (exactly): how many, and how many run SCHED_IDLE. */
static bool threads_sched(pid_t pid, const char *name, int *n, int *idle)
{
	char path[64], comm[64];
	struct dirent *de;
	DIR *dir;

	*n = *idle = 0;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((de = readdir(dir))) {
		FILE *f;
		char p2[384];

		if (de->d_name[0] == '.')
			continue;
		snprintf(p2, sizeof(p2), "%s/%s/comm", path, de->d_name);
		f = fopen(p2, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && (comm[strcspn(comm, "\n")] = '\0', 1) &&
		    !strcmp(comm, name)) {
			int pol = sched_getscheduler((pid_t)atoi(de->d_name));

			ck_assert_int_ge(pol, 0);
			(*n)++;
			*idle += pol == SCHED_IDLE;
		}
		fclose(f);
	}
	closedir(dir);
	return *n > 0;
}

static void sched_conf(char *conf, size_t len, const char *dir, const char *extra)
{
	snprintf(ep, sizeof(ep), "ipc://%s/events", dir);
	snprintf(conf, len,
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = 64\nnamespace = shared\n"
		 "events_endpoint = %s\nevents_namespaces = shared\nevents_topic = kv@test@tiny\n%s",
		 BT, ep, extra);
}

/* Whether the daemon found that its publisher may leave SCHED_IDLE (CAP_SYS_NICE, RLIMIT_NICE). */
static bool idle_allowed(const struct daemon *dm)
{
	return !daemon_log_has(dm, "events_sched = idle: the event publisher runs as the daemon does");
}

/*
 * events_sched: by default (idle) the publisher thread runs SCHED_IDLE, and neither ZMQ's I/O
 * thread nor the loop's does; normal leaves the publisher as the daemon runs.  (Where the
 * publisher could not leave SCHED_IDLE again, the daemon says so and leaves it as it runs:
 * sched_unprivileged.)
 */
START_TEST(sched)
{
	static const char *const modes[] = { "", "events_sched = idle\n", "events_sched = normal\n" };
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[1024];
	int n, idle;

	for (size_t m = 0; m < 3; m++) {
		ck_assert_ptr_nonnull(mkdtemp(strcpy(dir, "/tmp/kvpaged-events-XXXXXX")));
		sched_conf(conf, sizeof(conf), dir, modes[m]);
		daemon_start(&d, conf);
		threads_sched(d.pid, "kvpaged", &n, &idle); /* the loop's thread */
		ck_assert_int_eq(n, 1);
		ck_assert_int_eq(idle, 0);
		ck_assert_msg(threads_sched(d.pid, "kvpaged-events", &n, &idle), "no publisher");
		ck_assert_int_eq(n, 1);
		ck_assert_int_eq(idle, m < 2 && idle_allowed(&d));
		ck_assert_msg(threads_sched(d.pid, "ZMQbg/IO/0", &n, &idle), "no ZMQ I/O thread");
		ck_assert_int_eq(idle, 0);
		stop_and_clean(dir);
	}
}
END_TEST

/*
 * Without CAP_SYS_NICE (dropped from the bounding set, so the daemon's exec has it not even as
 * root), leaving SCHED_IDLE takes an RLIMIT_NICE of 20: with 0 the daemon says it cannot, and
 * runs the publisher at its own priority; with 20 (systemd's LimitNICE=+0, as kvpaged.service
 * sets) it is SCHED_IDLE.
 */
START_TEST(sched_unprivileged)
{
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[1024];
	struct rlimit rl;
	int n, idle;

	if (getenv("CK_FORK") && !strcmp(getenv("CK_FORK"), "no")) {
		fprintf(stderr, "test-events: sched_unprivileged skipped: CK_FORK=no (it drops a "
				"capability for good)\n");
		return;
	}
	if (geteuid() == 0)
		ck_assert_int_eq(prctl(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0), 0);
	ck_assert_int_eq(getrlimit(RLIMIT_NICE, &rl), 0);
	for (int pass = 0; pass < 2; pass++) {
		rl.rlim_cur = pass ? 20 : 0;
		if (rl.rlim_max < rl.rlim_cur)
			rl.rlim_max = rl.rlim_cur;
		if (setrlimit(RLIMIT_NICE, &rl) < 0) {
			/* Raising the hard limit takes CAP_SYS_RESOURCE, which a container may lack. */
			ck_assert_int_eq(pass, 1);
			fprintf(stderr, "test-events: sched_unprivileged: RLIMIT_NICE 20 not tried: "
					"cannot raise the hard limit here: %s\n", strerror(errno));
			break;
		}
		ck_assert_ptr_nonnull(mkdtemp(strcpy(dir, "/tmp/kvpaged-events-XXXXXX")));
		sched_conf(conf, sizeof(conf), dir, "");
		daemon_start(&d, conf);
		ck_assert_msg(threads_sched(d.pid, "kvpaged-events", &n, &idle), "no publisher");
		ck_assert_int_eq(idle, pass);
		ck_assert_int_eq(daemon_log_has(&d, "could not be raised when it falls behind"), !pass);
		stop_and_clean(dir);
	}
}
END_TEST

#ifdef KVPAGED_TEST_HOOKS
/*
 * A publisher starved at SCHED_IDLE (the test hook KVPAGED_TEST_EVENTS_STARVE: while idle it
 * takes nothing, as one that gets no CPU on a saturated node): the loop raises it once the
 * oldest event waited four intervals, the events come, the stats count the raise;
 * EVENTS_RAISED_BATCHES intervals later (0.5 s here) it is SCHED_IDLE again, and the next
 * commit raises it again.
 */
START_TEST(raised)
{
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[1024];
	static char st[65536];
	static struct seen w;
	static struct sub live;
	struct kvp_client *c;
	uint32_t t[5][BT];
	long long base;
	int n, idle;

	memset(&w, 0, sizeof(w));
	snprintf(w.fmt, sizeof(w.fmt), "map");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	sched_conf(conf, sizeof(conf), dir, "events_batch_ms = 5\n");
	setenv("KVPAGED_TEST_EVENTS_STARVE", "1", 1);
	daemon_start(&d, conf);
	unsetenv("KVPAGED_TEST_EVENTS_STARVE");
	if (!idle_allowed(&d)) {
		fprintf(stderr, "test-events: raised skipped: the publisher may not leave SCHED_IDLE "
				"here (no CAP_SYS_NICE, RLIMIT_NICE below 20)\n");
		stop_and_clean(dir);
		return;
	}
	daemon_copy_ctl(&d);
	sub_start(&live, "listen", ep, NULL);
	msleep(300);
	c = connect_ns(NULL, 0);
	/*
	 * The start's AllBlocksCleared waits for the first raise (by this commit, or the tick):
	 * once it and this block are out and the publisher is idle again, the rounds start.
	 */
	prompt(t[4], BT, 300000);
	commit(c, t[4], BT);
	UNTIL(&live, &w, w.stored[1] == 1);
	for (int i = 0; i < 50 && (threads_sched(d.pid, "kvpaged-events", &n, &idle), !idle); i++)
		msleep(100);
	ck_assert_int_eq(idle, 1);
	ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
	base = json_int(st, "raised");
	ck_assert_int_ge(base, 1);
	for (uint32_t round = 0; round < 2; round++) {
		/* Held: the publisher takes nothing while idle. */
		prompt(t[2 * round], BT, 100000 + 1000 * round);
		commit(c, t[2 * round], BT);
		drain(&live, &w, 100);
		/* (unless the loop's tick, every 2 s, found it late first: raised by then) */
		if (w.stored[1] != 1 + 2 * round) {
			ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
			ck_assert_int_eq(json_int(st, "raised"), base + round + 1);
		}
		/* The next event finds the first one late: raised, and both are published. */
		prompt(t[2 * round + 1], BT, 200000 + 1000 * round);
		commit(c, t[2 * round + 1], BT);
		UNTIL(&live, &w, w.stored[1] == 1 + 2 * round + 2);
		ck_assert_int_eq(ctl(&d, "stats", st, sizeof(st)), 0);
		ck_assert_int_eq(json_int(st, "raised"), base + round + 1);
		for (int i = 0; i < 50; i++) {
			threads_sched(d.pid, "kvpaged-events", &n, &idle);
			if (idle)
				break;
			msleep(100);
		}
		ck_assert_int_eq(idle, 1);
	}
	ck_assert_uint_eq(blocks_at(&w, 1, t[0], 1) + blocks_at(&w, 1, t[3], 1), 2);
	c = kvp_disconnect(c);
	sub_stop(&live);
	seen_free(&w);
	stop_and_clean(dir);
}
END_TEST
#endif

/* Whether the block of tokens t (BT of them) is announced at medium m. */
static bool block_at(const struct seen *w, int m, const uint32_t *t)
{
	return blocks_at(w, m, t, 1) == 1;
}

/*
 * The remote tier (a real redis-server, standalone: a one-node cluster), remote_tier_write =
 * commit: a block is announced on STORAGE once its store comes back, beside CPU; at most
 * events_remote_blocks of them, the oldest removed first; a block the swap files hold too is
 * announced once and stays while either level has it; a fetch that finds the value gone
 * removes it; drop-cache of everything forgets the remote tier's blocks with the rest; and
 * with remote_tier_ttl_ms they are removed once their time is up.
 */
START_TEST(remote)
{
	static struct seen w;
	static struct sub live;
	static struct redis_fixture fx;
	char dir[] = "/tmp/kvpaged-events-XXXXXX", conf[2048], swap[160], key[192], out[4096];
	uint32_t a[3 * BT], b[2 * BT], x[3 * BT], c2[2 * BT], hold[BT], e1[BT];
	struct kvp_table tab = { 0 };
	struct kvp_client *c;
	uint32_t cached;
	uint64_t held;

	memset(&w, 0, sizeof(w));
	snprintf(w.fmt, sizeof(w.fmt), "map");
	redis_fixture_standalone(&fx);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ep, sizeof(ep), "ipc://%s/events", dir);
	snprintf(swap, sizeof(swap), "%s/swap", dir);
	snprintf(key, sizeof(key), "%s/remote.key", dir);
	write_remote_key(key, 3);
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = 8\nfile_tier_blocks = 64\nswap_files = %s\n"
		 "namespace = shared\nremote_tier = redis://127.0.0.1:%u\n"
		 "remote_tier_key_file = %s\nremote_tier_timeout_ms = 2000\n"
		 "events_endpoint = %s\nevents_topic = kv@test@tiny\nevents_namespaces = shared\n"
		 "events_batch_ms = 5\nevents_remote_blocks = 4\n",
		 BT, swap, fx.s[0].port, key, ep);
	daemon_start(&d, conf);
	daemon_copy_ctl(&d);
	sub_start(&live, "listen", ep, NULL);
	msleep(300);
	c = connect_ns(NULL, 0);

	/* A commit: three blocks on CPU, then on STORAGE as their stores come back. */
	prompt(a, 3 * BT, 1000);
	commit(c, a, 3 * BT);
	UNTIL(&live, &w, blocks_at(&w, 2, a, 3) == 3);
	ck_assert_uint_eq(blocks_at(&w, 1, a, 3), 3);
	/* Two more: five stored, four remembered; the oldest, a's first, is removed. */
	prompt(b, 2 * BT, 3000);
	commit(c, b, 2 * BT);
	UNTIL(&live, &w, blocks_at(&w, 2, b, 2) == 2);
	UNTIL(&live, &w, !block_at(&w, 2, a));
	ck_assert(block_at(&w, 2, a + BT) && block_at(&w, 2, a + 2 * BT));
	ck_assert_uint_eq(w.removed[2], 1);

	/*
	 * Out of the pool into the swap files: gone from CPU, on STORAGE once (apply() fails a
	 * second BlockStored at one medium), and still there as the ring forgets them.
	 */
	for (uint32_t i = 0; i < 3; i++) {
		prompt(x, 3 * BT, 20000 + 1000 * i);
		commit(c, x, 3 * BT);
	}
	UNTIL(&live, &w, blocks_at(&w, 1, a, 3) == 0 && blocks_at(&w, 2, a, 3) == 3);
	drain(&live, &w, 300);
	ck_assert_uint_eq(blocks_at(&w, 2, a, 3), 3);

	/*
	 * A fetch that finds the value gone: a sequence keeps one block so that drop-cache does
	 * not empty the node (no AllBlocksCleared); c2's blocks leave the pool and the files,
	 * Redis forgets them, and the open that fetches them removes them from STORAGE.
	 */
	prompt(hold, BT, 90000);
	ck_assert_int_eq(kvp_open(c, hold, BT, 0, 0, &held, &cached, &tab), 0);
	ck_assert_int_eq(kvp_commit(c, held, BT, &tab), 0);
	kvp_table_free(&tab);
	prompt(c2, 2 * BT, 7000);
	commit(c, c2, 2 * BT);
	UNTIL(&live, &w, blocks_at(&w, 2, c2, 2) == 2);
	ck_assert_int_eq(ctl(&d, "drop-cache", out, sizeof(out)), 0);
	UNTIL(&live, &w, blocks_at(&w, 1, c2, 2) == 0);
	ck_assert_uint_eq(blocks_at(&w, 2, c2, 2), 2); /* the remote tier's, as far as we know */
	ck_assert_uint_eq(w.cleared, 0);
	freeReplyObject(redis_direct(fx.s[0].port, "FLUSHALL"));
	ck_assert_int_eq(kvp_open(c, c2, 2 * BT, 0, 0, &held, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 0);
	kvp_table_free(&tab);
	UNTIL(&live, &w, blocks_at(&w, 2, c2, 2) == 0);
	ck_assert_int_eq(kvp_close(c, held), 0);

	/* drop-cache of everything: AllBlocksCleared, and a's blocks are new again after it. */
	c = kvp_disconnect(c);
	ck_assert_int_eq(ctl(&d, "drop-cache", out, sizeof(out)), 0);
	UNTIL(&live, &w, w.cleared == 1);
	c = connect_ns(NULL, 0);
	commit(c, a, 3 * BT);
	UNTIL(&live, &w, blocks_at(&w, 2, a, 3) == 3 && blocks_at(&w, 1, a, 3) == 3);
	c = kvp_disconnect(c);
	sub_stop(&live);
	stop_and_clean(dir);
	seen_free(&w);

	/* remote_tier_ttl_ms: removed once the time is up (checked every 2 s). */
	memset(&w, 0, sizeof(w));
	snprintf(w.fmt, sizeof(w.fmt), "map");
	ck_assert_ptr_nonnull(mkdtemp(strcpy(dir, "/tmp/kvpaged-events-XXXXXX")));
	snprintf(ep, sizeof(ep), "ipc://%s/events", dir);
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\ncapacity_blocks = 8\nnamespace = shared\n"
		 "remote_tier = redis://127.0.0.1:%u\nremote_tier_key_file = %s\n"
		 "remote_tier_timeout_ms = 2000\nremote_tier_ttl_ms = 1000\n"
		 "events_endpoint = %s\nevents_topic = kv@test@tiny\nevents_namespaces = shared\n"
		 "events_batch_ms = 5\n",
		 BT, fx.s[0].port, key, ep);
	daemon_start(&d, conf);
	sub_start(&live, "listen", ep, NULL);
	msleep(300);
	c = connect_ns(NULL, 0);
	prompt(e1, BT, 60000);
	commit(c, e1, BT);
	UNTIL(&live, &w, block_at(&w, 2, e1));
	UNTIL(&live, &w, !block_at(&w, 2, e1));
	ck_assert(block_at(&w, 1, e1)); /* still in the pool */
	c = kvp_disconnect(c);
	sub_stop(&live);
	seen_free(&w);
	unlink(key);
	stop_and_clean(dir);
	redis_fixture_stop(&fx);
}
END_TEST

/* Configuration: tcp:// refused (token ids would reach anyone), events_* without a stream. */
START_TEST(bad_config)
{
	char log[4096];

	ck_assert_int_ne(daemon_refuses("[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\n"
					"element_bytes = 4\nblock_tokens = 16\ncapacity_blocks = 8\n"
					"events_endpoint = tcp://127.0.0.1:5557\n",
					log, sizeof(log)),
			 0);
	ck_assert_msg(strstr(log, "kvpaged.conf:") && strstr(log, "CURVE"), "%s", log);
	ck_assert_int_ne(daemon_refuses("[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\n"
					"element_bytes = 4\nblock_tokens = 16\ncapacity_blocks = 8\n"
					"events_format = msgpack\n",
					log, sizeof(log)),
			 0);
	ck_assert_msg(strstr(log, "events_format") && strstr(log, "map, array"), "%s", log);
	ck_assert_int_ne(daemon_refuses("[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\n"
					"element_bytes = 4\nblock_tokens = 16\ncapacity_blocks = 8\n"
					"events_topic = kv@a@b\n",
					log, sizeof(log)),
			 0);
	ck_assert_msg(strstr(log, "events_topic: there is no event stream"), "%s", log);
	ck_assert_int_ne(daemon_refuses("[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\n"
					"element_bytes = 4\nblock_tokens = 16\ncapacity_blocks = 8\n"
					"events_endpoint = ipc:///tmp/kvpaged-ev-x\nevents_sched = low\n",
					log, sizeof(log)),
			 0);
	ck_assert_msg(strstr(log, "events_sched") && strstr(log, "idle, normal"), "%s", log);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("events");
	TCase *tc = tcase_create("events");
	const char *srcdir = getenv("srcdir");
	int r;

	snprintf(script, sizeof(script), "%s/tests/integration/events-sub.py",
		 srcdir ? srcdir : ".");
	if (system("/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null") != 0) {
		fprintf(stderr, "test-events: skipped: /usr/bin/python3 has no zmq or msgpack "
				"(python3-zmq, python3-msgpack)\n");
		return 77;
	}
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, stream, 0, 2);
	tcase_add_test(tc, queue_full);
	tcase_add_test(tc, persisted);
	tcase_add_test(tc, curve);
	tcase_add_test(tc, slow_subscriber);
	tcase_add_test(tc, sched);
	tcase_add_test(tc, sched_unprivileged);
#ifdef KVPAGED_TEST_HOOKS
	tcase_add_test(tc, raised);
#endif
	tcase_add_test(tc, bad_config);
	suite_add_tcase(s, tc);
	if (!redis_fixture_suite_ready(s, &r))
		return r;
	tc = redis_fixture_case(s, "remote", 60);
	tcase_add_test(tc, remote);
	r = run_suite(s);
#ifndef KVPAGED_TEST_HOOKS
	fprintf(stderr, "test-events: raised skipped: no test hooks (configure --enable-test-hooks)\n");
	return r == EXIT_SUCCESS ? 77 : r;
#endif
	return r;
}
