/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The process default: what the registry builds for a device on first use,
 * chosen from the environment with no code change (as
 * PYTORCH_CUDA_ALLOC_CONF and JULIA_CUDA_MEMORY_POOL do).
 *
 *   RMMC_ALLOC_CONF   a stack spec (spec.h), e.g.
 *                     RMMC_ALLOC_CONF="statistics > pool(initial=1GiB) > cuda":
 *                     every device's default resource is that stack, built
 *                     for the device on its first use. Unset or blank: the
 *                     plain cuda resource.
 *                     One spec per device: items separated by ';', each
 *                     `DEVICES: SPEC` with DEVICES a device number, a list
 *                     and ranges (`0,2`, `1-3`) or `*`; an item without a
 *                     device list (or `*`) serves every device no other item
 *                     names, devices named nowhere get the plain cuda
 *                     resource. RMMC_ALLOC_CONF="pool > cuda; 1: pool(
 *                     maximum_size=40GiB) > cuda" gives device 1 a capped pool and every
 *                     other device a plain one. A device named twice, two
 *                     items for every device or a list that does not parse
 *                     is a parse error like a bad spec.
 *   RMMC_NO_CACHING   1 (or true, yes, on) forces the plain cuda resource
 *                     (cudaMalloc/cudaFree per allocation) whatever
 *                     RMMC_ALLOC_CONF says, so memory checkers such as
 *                     compute-sanitizer see every allocation (PyTorch's
 *                     PYTORCH_NO_CUDA_MEMORY_CACHING). 0, false, no, off or
 *                     blank leave RMMC_ALLOC_CONF in charge.
 *
 *   RMMC_ALLOC_CONF_FALLBACK
 *                     1 (or true, yes, on): a bad RMMC_ALLOC_CONF falls back
 *                     to the plain cuda resource, as before 0.2. Unset, 0,
 *                     false, no, off or blank: strict (below).
 *
 * The environment is read once, at the first default built, the first
 * rmmc_default_config_status() or rmmc_set_default_spec() call, whichever
 * comes first. A value that does not parse is reported once on stderr (the
 * one place rmmc prints without being asked: the environment asked) and
 * through rmmc_default_config_status(), and then, strictly, every registry
 * lookup that would build a default (rmmc_allocate(), the plug-ins, buffers
 * on a device with no resource set) fails with that status and message, GPU
 * or not, so a typo cannot silently cost a cudaMalloc per allocation. The
 * PyTorch plug-in's allocations then return NULL (torch raises) and the
 * Python package raises at rmmc.torch.use() / rmmc.cupy.use(). A value in
 * PyTorch's syntax (`expandable_segments:True`) is recognised and the
 * message says what the rmmc spelling is (`pool(expandable=true) > cuda`).
 * A spec that parses but cannot be built for a device (an initial pool
 * larger than the device, say) fails that lookup the same way, and the
 * next lookup tries again. With RMMC_ALLOC_CONF_FALLBACK=1 both problems
 * give the device the plain cuda resource instead, reported once.
 */
#ifndef RMMC_DEFAULTS_H
#define RMMC_DEFAULTS_H

#include <stddef.h>

#include "rmmc/export.h"
#include "rmmc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The spec used when nothing else is asked for. */
#define RMMC_DEFAULT_SPEC "cuda"

/* Works out the spec the process default uses for the given values of
 * RMMC_ALLOC_CONF and RMMC_NO_CACHING (NULL: unset), without reading the
 * environment, printing or building anything, and writes it into `spec`
 * (`len` bytes, always terminated). RMMC_SUCCESS: `spec` is the
 * configuration to build from (one spec, or per-device items:
 * rmmc_default_config_device_spec() picks a device's). RMMC_ERROR_PARSE: a value does not parse (the message says which
 * and why, quoting the spec with a caret) and `spec` is the fallback,
 * RMMC_DEFAULT_SPEC. RMMC_ERROR_INVALID_ARGUMENT for a NULL spec or a
 * buffer too small for the result. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_default_config_resolve(const char *alloc_conf,
                                                      const char *no_caching, char *spec,
                                                      size_t len);

/* The spec device `device` uses under `config`, a configuration of
 * RMMC_ALLOC_CONF's form (one spec, or per-device items; what
 * rmmc_default_config_resolve() writes and rmmc_default_config_status()
 * returns): the item naming the device, else the item for every device,
 * else RMMC_DEFAULT_SPEC. Written into `spec` (`len` bytes, terminated).
 * RMMC_ERROR_PARSE for a configuration that does not parse (the message
 * says where); RMMC_ERROR_INVALID_ARGUMENT for NULL, a device out of
 * [0, 64) or a buffer too small. Pure: reads no environment, builds
 * nothing. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_default_config_device_spec(const char *config, int device,
                                                          char *spec, size_t len);

/* Sets the spec (or per-device specs, as RMMC_ALLOC_CONF takes them) every
 * device's default is built from on its first use, replacing the
 * environment's (RMMC_ALLOC_CONF) from code; devices that
 * already have a resource keep it (rmmc_set_device_resource() replaces
 * those). RMMC_NO_CACHING=1 still wins: the default stays cuda. A broken
 * RMMC_ALLOC_CONF no longer matters once this succeeds
 * (rmmc_default_config_status() then says RMMC_SUCCESS). RMMC_ERROR_PARSE
 * for a spec that does not parse (nothing changes; PyTorch's syntax is
 * recognised as above); RMMC_ERROR_INVALID_ARGUMENT for NULL. Thread-safe;
 * strings rmmc_default_config_status() returned before are stale after it.
 * Builds nothing and never calls CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_set_default_spec(const char *spec);

/* Reads the environment if that has not happened yet and says how the
 * process default was configured: RMMC_SUCCESS when the environment parsed
 * and every default built so far is what it asked for; otherwise the
 * status of the first problem: RMMC_ERROR_PARSE for a value that does not
 * parse (lookups fail with it, or use the plain cuda resource under
 * RMMC_ALLOC_CONF_FALLBACK=1), or, under the fallback only, the status a
 * layer returned when the spec was built for a device. *spec (if spec is
 * not NULL) receives the spec the environment or rmmc_set_default_spec()
 * chose (RMMC_DEFAULT_SPEC after a parse error) and *message (if not NULL) "" or the text reported
 * on stderr; both strings live as long as the process. Thread-safe; never
 * calls CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_default_config_status(const char **spec, const char **message);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_DEFAULTS_H */
