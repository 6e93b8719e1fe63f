/* bench/slow_link.py's LD_PRELOAD shim: a node's outgoing TCP connections leave from its own address.
 *
 * Gloo listens on the address its hostname resolves to (each bench node's own 127.0.0.x), but the
 * kernel gives an outgoing connection to a loopback address the source 127.0.0.1, so a packet's
 * addresses could not say which node sent it. Binding each IPv4 socket that connects to 127/8 to
 * HF_BIND_SRC first makes every packet carry its node's address at both ends: traffic within a
 * node is A->A, between nodes A->B, and only the latter goes through the throttled classes.
 * Build: gcc -shared -fPIC -O2 -o bind_src.so bench/_bind_src.c -ldl
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static connect_fn real = NULL;
    if (!real) real = (connect_fn)dlsym(RTLD_NEXT, "connect");
    const char *src = getenv("HF_BIND_SRC");
    if (src && addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *dst = (const struct sockaddr_in *)addr;
        if ((ntohl(dst->sin_addr.s_addr) >> 24) == 127) {
            struct sockaddr_in me;
            memset(&me, 0, sizeof me);
            me.sin_family = AF_INET;
            if (inet_pton(AF_INET, src, &me.sin_addr) == 1)
                bind(fd, (const struct sockaddr *)&me, sizeof me); /* best effort: a bound socket keeps its own */
        }
    }
    return real(fd, addr, len);
}
