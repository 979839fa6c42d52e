// The plugin runs on glibc 2.17 and later (RHEL 7, Ubuntu 18.04, DGX OS 5),
// though it is built against a newer one. Built against glibc 2.34 or later,
// the start file calls __libc_start_main@GLIBC_2.34, which older glibc does
// not have, and passes no init function: glibc 2.34 runs the executable's
// constructors itself, older ones leave them to that function. This
// definition, the executable's own, takes the start file's call and makes
// it to the oldest version of __libc_start_main with an init function that
// runs the constructors as older glibc's start files did; glibc 2.34 and
// later run the init function they are given, in place of their own. The
// other symbols glibc 2.34 gave new versions are bound to their old ones by
// packaging/glibc-compat.h, which the release build includes everywhere.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#if defined(__x86_64__)
#define NOMAD_GPU_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define NOMAD_GPU_GLIBC_BASE "GLIBC_2.17"
#else
#error "no glibc base version known for this architecture"
#endif

__asm__(".symver dlvsym,dlvsym@" NOMAD_GPU_GLIBC_BASE);

typedef int (*main_fn)(int, char **, char **);
typedef void (*init_fn)(int, char **, char **);
typedef int (*start_fn)(main_fn, int, char **, init_fn, void (*)(void), void (*)(void), void *);

extern init_fn __preinit_array_start[] __attribute__((weak));
extern init_fn __preinit_array_end[] __attribute__((weak));
extern init_fn __init_array_start[] __attribute__((weak));
extern init_fn __init_array_end[] __attribute__((weak));
extern void _init(void);

// constructors is what older glibc's start files passed as init
// (__libc_csu_init).
static void constructors(int argc, char **argv, char **envp) {
	for (init_fn *f = __preinit_array_start; f < __preinit_array_end; f++) {
		(*f)(argc, argv, envp);
	}
	_init();
	for (init_fn *f = __init_array_start; f < __init_array_end; f++) {
		(*f)(argc, argv, envp);
	}
}

int __libc_start_main(main_fn main, int argc, char **argv, init_fn init, void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
	// libc is loaded and initialised before the executable's start: the
	// lookup is what preloaded libraries wrapping this function do.
	start_fn start = (start_fn)dlvsym(RTLD_NEXT, "__libc_start_main", NOMAD_GPU_GLIBC_BASE);
	return start(main, argc, argv, init != NULL ? init : constructors, fini, rtld_fini, stack_end);
}
