/* Included in every C file of the plugin's release build (CGO_CFLAGS
 * -include, scripts/release.sh): binds the glibc functions that go-nvml and
 * Go's runtime call, which glibc 2.32 and 2.34 gave new versions when they
 * moved into libc, to their first versions, which every glibc since 2.17
 * has (in libdl and libpthread before 2.34, which the build links to). With
 * cmd/nomad-device-gpu/glibc.c the plugin then needs glibc 2.17 or later. */
#ifndef __ASSEMBLER__
#if defined(__x86_64__)
#define NOMAD_GPU_GLIBC_BASE "GLIBC_2.2.5"
#define NOMAD_GPU_GLIBC_DLINFO "GLIBC_2.3.3"
#elif defined(__aarch64__)
#define NOMAD_GPU_GLIBC_BASE "GLIBC_2.17"
#define NOMAD_GPU_GLIBC_DLINFO "GLIBC_2.17"
#else
#error "no glibc base version known for this architecture"
#endif
__asm__(".symver dlopen,dlopen@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver dlsym,dlsym@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver dlinfo,dlinfo@" NOMAD_GPU_GLIBC_DLINFO);
__asm__(".symver pthread_create,pthread_create@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver pthread_key_create,pthread_key_create@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver pthread_setspecific,pthread_setspecific@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver pthread_attr_getstack,pthread_attr_getstack@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver pthread_attr_getstacksize,pthread_attr_getstacksize@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver pthread_getattr_np,pthread_getattr_np@" NOMAD_GPU_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" NOMAD_GPU_GLIBC_BASE);
#endif
