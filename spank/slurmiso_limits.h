/* Generated from slurmiso/submit/options.py (python3 -m slurmiso.submit.options >
 * spank/slurmiso_limits.h); do not edit. job_submit.lua and the Prolog apply the same
 * limits; tests/unit/test_option_validator.py checks this file is current. */
#ifndef SLURMISO_LIMITS_H
#define SLURMISO_LIMITS_H

#define SLURMISO_CLASS_MAX_LEN 32
#define SLURMISO_CLASS_FIRST "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#define SLURMISO_CLASS_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
#define SLURMISO_SIZE_MAX_LEN 16
#define SLURMISO_SIZE_MAX_INT_DIGITS 7
#define SLURMISO_SIZE_MAX_FRAC_DIGITS 3
#define SLURMISO_SIZE_MIN_MIB 1ULL
#define SLURMISO_SIZE_MAX_MIB 1048576ULL
#define SLURMISO_PROFILE_MAX_LEN 16
#define SLURMISO_PROFILE_MAX_MEM_DIGITS 4
#define SLURMISO_DIR_MAX_LEN 1024
#define SLURMISO_DIR_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/._-+@%,="
#define SLURMISO_METRICS_PORT_MIN 1024
#define SLURMISO_METRICS_PORT_MAX 65535
#define SLURMISO_METRICS_PATH_MAX_LEN 64
#define SLURMISO_METRICS_PATH_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/_.-"
#define SLURMISO_SIZE_UNITS "KMGT"
#define SLURMISO_SIZE_UNITS_KIB { 1ULL, 1024ULL, 1048576ULL, 1073741824ULL }

#endif
