/* SPDX-License-Identifier: MIT */
/*
 * What clients make the daemon hold, counted at every level a limit applies to: the session,
 * its uid (over all pools), its namespace (in its pool) and the whole daemon.  A uid cannot
 * multiply its quotas by opening sessions, nor a tenant by opening namespaces under several
 * uids, and the daemon as a whole stays within max_total_bytes.
 *
 * Three kinds of things are counted: bytes (receive buffers, queued replies, rings, and what
 * the core keeps for each sequence, which core_seq_bytes() bounds ahead of every call that
 * grows it), block-table entries and open sequences.  A request that would take a level past
 * its limit is refused (account_check: -EDQUOT, -EMFILE) before anything changes; replies are
 * never refused, they make the session stop reading instead (account_over).
 *
 * Admin sessions are the operator's: counted apart (their own slots), never refused for what
 * clients hold, and their buffers count only against themselves.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/server/server.h"

static struct uid_account **bucket(struct server *srv, uint32_t uid)
{
	return &srv->uids[(uid * 2654435761u) >> 24 & (SERVER_UID_BUCKETS - 1)];
}

struct uid_account *account_uid_get(struct server *srv, uint32_t uid)
{
	struct uid_account **b = bucket(srv, uid), *a;

	for (a = *b; a; a = a->next)
		if (a->uid == uid) {
			a->refs++;
			return a;
		}
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->uid = uid;
	a->refs = 1;
	a->next = *b;
	*b = a;
	return a;
}

struct uid_account *account_uid_find(struct server *srv, uint32_t uid)
{
	for (struct uid_account *a = *bucket(srv, uid); a; a = a->next)
		if (a->uid == uid)
			return a;
	return NULL;
}

void account_uid_put(struct server *srv, struct uid_account *a)
{
	struct uid_account **p;

	if (!a || --a->refs > 0)
		return;
	for (p = bucket(srv, a->uid); *p != a; p = &(*p)->next)
		;
	*p = a->next;
	free(a);
}

void account_bytes(struct session *s, int64_t delta)
{
	s->bytes += (uint64_t)delta;
	if (s->admin)
		return;
	s->acct->use.bytes += (uint64_t)delta;
	if (s->stats)
		s->stats->use.bytes += (uint64_t)delta;
	s->srv->use.bytes += (uint64_t)delta;
}

void account_blocks(struct session *s, int64_t delta)
{
	s->blocks += (uint64_t)delta;
	s->acct->use.blocks += (uint64_t)delta;
	if (s->stats)
		s->stats->use.blocks += (uint64_t)delta;
	s->srv->use.blocks += (uint64_t)delta;
}

void account_sequences(struct session *s, int32_t delta)
{
	s->acct->use.sequences += (uint32_t)delta;
	if (s->stats)
		s->stats->use.sequences += (uint32_t)delta;
	s->srv->use.sequences += (uint32_t)delta;
}

void account_join_ns(struct session *s, struct ns_stats *ns)
{
	s->stats = ns;
	ns->use.bytes += s->bytes;
	ns->use.blocks += s->blocks;
	ns->use.sequences += s->nseqs;
	ns->use.sessions++;
}

void account_leave_ns(struct session *s)
{
	struct ns_stats *ns = s->stats;

	if (!ns)
		return;
	ns->use.bytes -= s->bytes;
	ns->use.blocks -= s->blocks;
	ns->use.sequences -= s->nseqs;
	ns->use.sessions--;
	ns->last_used = server_now_ns();
	s->stats = NULL;
}

/* Whether used + more stays within cap; a cap of 0 is no cap. */
static bool fits(uint64_t used, uint64_t more, uint64_t cap)
{
	return !cap || (used <= cap && more <= cap - used);
}

int account_check(const struct session *s, uint64_t bytes, uint64_t blocks, uint32_t sequences,
		  const char **why)
{
	const struct kvpd_limits *l = &s->srv->cfg->limits;
	const struct ns_stats *ns = s->stats;
	const struct usage *u = &s->acct->use;
	uint64_t max_blocks = l->max_blocks;

	if (s->admin)
		return 0;
	if (!max_blocks && s->pool)
		max_blocks = s->pool->cfg->capacity_blocks;
	if (sequences) {
		if (!fits(s->nseqs, sequences, l->max_sequences)) {
			*why = "session has max_sequences sequences open";
			return -EMFILE;
		}
		if (!fits(u->sequences, sequences, l->max_sequences_per_uid)) {
			*why = "the uid has max_sequences_per_uid sequences open";
			return -EMFILE;
		}
		if (ns && !fits(ns->use.sequences, sequences, l->max_sequences_per_namespace)) {
			*why = "the namespace has max_sequences_per_namespace sequences open";
			return -EMFILE;
		}
	}
	if (blocks) {
		if (!fits(s->blocks, blocks, max_blocks)) {
			*why = "session would exceed its max_blocks quota";
			return -EDQUOT;
		}
		if (!fits(u->blocks, blocks, l->max_blocks_per_uid)) {
			*why = "the uid would exceed its max_blocks_per_uid quota";
			return -EDQUOT;
		}
		if (ns && !fits(ns->use.blocks, blocks, l->max_blocks_per_namespace)) {
			*why = "the namespace would exceed its max_blocks_per_namespace quota";
			return -EDQUOT;
		}
	}
	if (bytes) {
		if (!fits(s->bytes, bytes, l->max_session_bytes)) {
			*why = "session would hold more memory than max_session_bytes";
			return -EDQUOT;
		}
		if (!fits(u->bytes, bytes, l->max_bytes_per_uid)) {
			*why = "the uid would hold more memory than max_bytes_per_uid";
			return -EDQUOT;
		}
		if (ns && !fits(ns->use.bytes, bytes, l->max_bytes_per_namespace)) {
			*why = "the namespace would hold more memory than max_bytes_per_namespace";
			return -EDQUOT;
		}
		if (!fits(s->srv->use.bytes, bytes, l->max_total_bytes)) {
			*why = "the daemon would hold more memory for clients than max_total_bytes";
			return -EDQUOT;
		}
	}
	return 0;
}

bool account_over(const struct session *s)
{
	const struct kvpd_limits *l = &s->srv->cfg->limits;

	if (s->admin)
		return false;
	return !fits(s->acct->use.bytes, 0, l->max_bytes_per_uid) ||
	       !fits(s->srv->use.bytes, 0, l->max_total_bytes) ||
	       (s->stats && !fits(s->stats->use.bytes, 0, l->max_bytes_per_namespace));
}

/* What s should be charged, recomputed from what it holds. */
static uint64_t session_bytes(const struct session *s, uint64_t *ret_blocks, char *why,
			      size_t len, bool *bad)
{
	uint64_t bytes = sizeof(*s) + s->rcap + s->req.bytes, blocks = 0;

	for (const struct outbuf *o = s->outq; o; o = o->next)
		bytes += sizeof(*o) + o->len;
	if (s->ring)
		bytes += sizeof(*s->ring) + s->ring->bytes + s->ring->scratch_bytes;
	for (uint32_t i = 0; s->pool && i < s->nseqs; i++) {
		const struct seq_owner *ow = &s->pool->owners[(uint32_t)s->seqs[i]];
		struct core_seq_info info;
		uint64_t want;

		if (core_seq_info(s->pool->core, s->seqs[i], &info) < 0)
			continue; /* the owner tables' check says so */
		want = core_seq_bytes(s->pool->core, info.retention, info.granularity, info.ntokens,
				      info.state);
		if (ow->bytes != want && !*bad) {
			snprintf(why, len, "session %llu: sequence %llu is charged %llu bytes, its "
				 "size and state call for %llu", (unsigned long long)s->id,
				 (unsigned long long)s->seqs[i], (unsigned long long)ow->bytes,
				 (unsigned long long)want);
			*bad = true;
		}
		bytes += ow->bytes;
		blocks += info.held_blocks;
	}
	*ret_blocks = blocks;
	return bytes;
}

static bool usage_equal(const struct usage *a, const struct usage *b)
{
	return a->bytes == b->bytes && a->blocks == b->blocks && a->sequences == b->sequences &&
	       a->sessions == b->sessions;
}

static void usage_add(struct usage *to, const struct session *s)
{
	to->bytes += s->bytes;
	to->blocks += s->blocks;
	to->sequences += s->nseqs;
	to->sessions++;
}

int account_verify(const struct server *srv, char *why, size_t len)
{
	struct usage all = { 0 };
	bool bad = false;

	for (const struct session *s = srv->sessions; s && !bad; s = s->next) {
		uint64_t blocks, bytes = session_bytes(s, &blocks, why, len, &bad);

		if (bad)
			break;
		if (bytes != s->bytes || (!s->closing && blocks != s->blocks)) {
			snprintf(why, len, "session %llu is charged %llu bytes and %llu blocks, holds "
				 "%llu and %llu", (unsigned long long)s->id,
				 (unsigned long long)s->bytes, (unsigned long long)s->blocks,
				 (unsigned long long)bytes, (unsigned long long)blocks);
			return -EUCLEAN;
		}
		if (!s->admin)
			usage_add(&all, s);
	}
	if (bad)
		return -EUCLEAN;
	if (!usage_equal(&all, &srv->use)) {
		snprintf(why, len, "the daemon counts %llu bytes, %llu blocks, %u sequences, %u "
			 "sessions; its sessions hold %llu, %llu, %u, %u",
			 (unsigned long long)srv->use.bytes, (unsigned long long)srv->use.blocks,
			 srv->use.sequences, srv->use.sessions, (unsigned long long)all.bytes,
			 (unsigned long long)all.blocks, all.sequences, all.sessions);
		return -EUCLEAN;
	}
	for (size_t b = 0; b < SERVER_UID_BUCKETS; b++)
		for (const struct uid_account *a = srv->uids[b]; a; a = a->next) {
			struct usage u = { 0 };
			uint32_t admin = 0;

			for (const struct session *s = srv->sessions; s; s = s->next)
				if (s->acct == a) {
					if (s->admin)
						admin++;
					else
						usage_add(&u, s);
				}
			if (!usage_equal(&u, &a->use) || admin != a->admin_sessions) {
				snprintf(why, len, "uid %u: counted %llu bytes, %llu blocks, %u "
					 "sequences, %u+%u sessions; its sessions hold %llu, %llu, "
					 "%u, %u+%u", a->uid, (unsigned long long)a->use.bytes,
					 (unsigned long long)a->use.blocks, a->use.sequences,
					 a->use.sessions, a->admin_sessions,
					 (unsigned long long)u.bytes, (unsigned long long)u.blocks,
					 u.sequences, u.sessions, admin);
				return -EUCLEAN;
			}
		}
	for (size_t i = 0; i < srv->npools; i++) {
		const struct dpool *p = &srv->pools[i];

		for (uint32_t j = 0; j < p->nns; j++) {
			struct usage u = { 0 };

			for (const struct session *s = srv->sessions; s; s = s->next)
				if (s->stats == p->ns[j])
					usage_add(&u, s);
			if (!usage_equal(&u, &p->ns[j]->use)) {
				snprintf(why, len, "pool %s namespace %s: counted %llu bytes, %llu "
					 "blocks, %u sequences, %u sessions; its sessions hold "
					 "%llu, %llu, %u, %u", p->cfg->name, p->ns[j]->name,
					 (unsigned long long)p->ns[j]->use.bytes,
					 (unsigned long long)p->ns[j]->use.blocks,
					 p->ns[j]->use.sequences, p->ns[j]->use.sessions,
					 (unsigned long long)u.bytes, (unsigned long long)u.blocks,
					 u.sequences, u.sessions);
				return -EUCLEAN;
			}
		}
	}
	return 0;
}
