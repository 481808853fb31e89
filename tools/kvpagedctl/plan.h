/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>

/* kvpagedctl plan SUBCOMMAND ...: argv[0] is "plan".  Returns the exit status. */
int cmd_plan(int argc, char **argv);
