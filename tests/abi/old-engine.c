/* SPDX-License-Identifier: MIT */
/*
 * An engine as it was built against libkvpaged 0.1.0: compiled with 0.1.0's public header
 * (tests/abi/0.1.0/kvpaged.h, a copy of it as released), linked with today's libkvpaged.so.1,
 * run against today's daemon (tests/abi/abi.test).  It uses every call 0.1.0 had, the socket and
 * the rings, and checks what each returns; exit 0 when everything behaved as 0.1.0 documented.
 */
#include <errno.h>
#include <kvpaged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVPAGED_VERSION_H
#error "built against today's header: this engine must see 0.1.0's only"
#endif

static int failures;

#define CHECK(cond)                                                                         \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "old-engine:%d: %s\n", __LINE__, #cond);           \
			failures++;                                                         \
		}                                                                           \
	} while (0)

int main(int argc, char **argv)
{
	struct kvp_connect_options o = { .size = sizeof(o), .client_name = "abi-0.1.0",
					 .ring_entries = 8, .ring_data_bytes = 1 << 16 };
	struct kvp_table table = { 0 }, child_table = { 0 };
	uint32_t tokens[40], cached = 0, ntok = 0, committed = 0, recompute = 99, out[16];
	struct kvp_completion done[2];
	struct kvp_client *c = NULL;
	uint64_t seq = 0, child = 0;
	char err[256] = "";

	if (argc != 2) {
		fprintf(stderr, "usage: old-engine SOCKET\n");
		return 2;
	}
	o.socket_path = argv[1];
	o.error_buf = err;
	o.error_len = sizeof(err);
	for (uint32_t i = 0; i < 40; i++)
		tokens[i] = 100 + i;
	if (kvp_connect(&o, &c) < 0) {
		fprintf(stderr, "old-engine: kvp_connect: %s\n", err);
		return 1;
	}
	CHECK(kvp_pool(c)->block_tokens == 16);
	CHECK(!strcmp(kvp_pool(c)->backend, "host"));
	CHECK(kvp_pool_base(c) != NULL && kvp_pool_device_ptr(c) == 0);
	CHECK(!strncmp(kvp_namespace(c), "uid:", 4));

	CHECK(kvp_open(c, tokens, 40, 0, KVP_OPEN_RECOMPUTE_LAST, &seq, &cached, &table) == 0);
	CHECK(cached == 0 && table.len == 3);
	CHECK(kvp_commit(c, seq, 40, &table) == 0);
	CHECK(kvp_lookup(c, tokens, 40, 0, 0, &cached) == 0 && cached == 32);
	CHECK(kvp_append(c, seq, tokens, 1, &table) == 0);
	CHECK(kvp_seq_info(c, seq, &ntok, &committed, &table) == 0 && ntok == 41 && committed == 40);
	CHECK(kvp_fork(c, seq, &child, &child_table) == 0 && child != seq && child_table.len == 3);
	CHECK(kvp_park(c, child) == 0);
	CHECK(kvp_append(c, child, tokens, 1, NULL) == -EBUSY);
	CHECK(kvp_resume(c, child, &recompute, &child_table) == 0 && recompute == 0);
	CHECK(kvp_close(c, child) == 0);
	CHECK(kvp_close(c, child) == -ENOENT && *kvp_last_error(c));
	kvp_set_wait(c, 0);

	/* The rings, with 0.1.0's struct kvp_op and its opcode numbers. */
	struct kvp_op ops[2] = {
		{ .opcode = KVP_NOP, .user_data = 1 },
		{ .opcode = KVP_OPEN, .user_data = 2, .arg = KVP_OPEN_RECOMPUTE_LAST,
		  .tokens = tokens, .ntokens = 40, .table_cap = 16, .table_out = out },
	};
	CHECK(kvp_submit(c, ops, 2) == 2);
	int got = 0;
	for (int tries = 0; got < 2 && tries < 100; tries++) {
		int r = kvp_complete(c, done + got, 2 - got, 1, 5000);

		CHECK(r >= 0);
		if (r < 0)
			break;
		got += r;
	}
	CHECK(got == 2);
	CHECK(done[0].user_data == 1 && done[0].res == 0);
	CHECK(done[1].user_data == 2 && done[1].res == 0 && done[1].aux == 32 &&
	      done[1].table_len == 3);
	CHECK(out[0] == table.blocks[0] && out[1] == table.blocks[1]); /* the shared prefix */
	CHECK(kvp_close(c, done[1].value) == 0);
	CHECK(kvp_close(c, seq) == 0);

	kvp_table_free(&table);
	kvp_table_free(&child_table);
	CHECK(kvp_disconnect(c) == NULL);
	if (failures)
		return 1;
	printf("ok: an engine built against libkvpaged 0.1.0's header ran\n");
	return 0;
}
