// SPDX-License-Identifier: Apache-2.0
/*
 * What the guest's check programs (verbs-check.c, access-check.c, write-check.c, qps-check.c)
 * share: failing a step with one "<FAIL_TAG> <step>: <reason>" line on stdout and exit status 1,
 * turning the two ways libibverbs and librdmacm report errors into such a failure, and (with
 * STEP_TAG defined) reporting a step done, and (with SAY defined) printing a line of output at
 * once. Define FAIL_TAG (and STEP_TAG, SAY) before including.
 */
#ifndef PVRDMA_GUEST_CHECK_H
#define PVRDMA_GUEST_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAIL_TAG
#error "define FAIL_TAG (e.g. \"VERBS-FAIL\") before including check.h"
#endif

static void __attribute__((noreturn, format(printf, 2, 3))) fail(const char *step, const char *fmt, ...)
{
	va_list ap;

	printf(FAIL_TAG " %s: ", step);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	exit(1);
}

/* libibverbs calls that return an int report the error as that value (errno for some);
 * librdmacm's return -1 and set errno. */
static void check_rc(const char *step, int rc)
{
	if (rc)
		fail(step, "%s (%d)", strerror(rc > 0 ? rc : errno), rc);
}

static void *check_ptr(const char *step, void *p)
{
	if (!p)
		fail(step, "%s", strerror(errno ? errno : EINVAL));
	return p;
}

#ifdef SAY
/* One line of output, flushed at once (a console reader waits for it). */
static void __attribute__((format(printf, 1, 2))) say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}
#endif

#ifdef STEP_TAG
/* Programs that report their steps (verbs-check.c, access-check.c): one "<STEP_TAG> <step> ok
 * [details]" line per step done, counted for their final line. */
static int steps;

static void __attribute__((format(printf, 2, 3))) ok(const char *step, const char *fmt, ...)
{
	va_list ap;

	steps++;
	printf(STEP_TAG " %s ok", step);
	if (fmt) {
		putchar(' ');
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
	}
	putchar('\n');
	fflush(stdout);
}
#endif

#endif
