/* SPDX-License-Identifier: MIT */
#include "daemon/core/cost.h"

uint64_t cost_bytes_per_token(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
			      uint32_t element_bytes)
{
	/* Each factor is below 2^32; check the running product against overflow. */
	uint64_t v = 2ull * layers;

	if (kv_heads && v > UINT64_MAX / kv_heads)
		return 0;
	v *= kv_heads;
	if (head_dim && v > UINT64_MAX / head_dim)
		return 0;
	v *= head_dim;
	if (element_bytes && v > UINT64_MAX / element_bytes)
		return 0;
	return v * element_bytes;
}

double cost_recompute_s(double params, double tokens, double flops)
{
	return 2.0 * params * tokens / flops;
}

double cost_transfer_s(double bytes, double bandwidth)
{
	return bytes / bandwidth;
}

enum cost_choice cost_choose(double transfer_one_way_s, double recompute_s)
{
	/* Swap-in is what the resuming request waits for; swap-out overlaps other work. */
	return transfer_one_way_s <= recompute_s ? COST_SWAP : COST_RECOMPUTE;
}
