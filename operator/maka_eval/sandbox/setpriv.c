/*
 * maka-setpriv: run a program with fewer privileges, for the container sandbox.
 *
 * Part of the verifier's toolbox (maka_eval/sandbox/toolbox.py): it is linked statically
 * and shown to every container read-only, so it runs the same in any image and loads
 * nothing from the container (no dynamic loader, no /etc/ld.so.preload, no library, no
 * name service: users and groups are numbers, resolved by the caller). It does what
 * util-linux's setpriv does for the sandbox's scripts, plus chroot and chdir:
 *
 *   maka-setpriv [--root DIR] [--cd DIR] [--keep-bounding HEX] [--drop-bounding N]
 *                [--uid N --gid N [--groups N,N,...]] [--ambient N] -- PROGRAM ARGS...
 *
 *   --root DIR          chroot to DIR (the verifier: the holder's root, /proc/PID/root)
 *   --cd DIR            then change to DIR, if it exists (the workdir)
 *   --keep-bounding HEX keep only these capabilities in the bounding set (a CapBnd mask)
 *   --drop-bounding N   drop capability N from the bounding set
 *   --uid, --gid        become this user and group (real, effective and saved), with
 *   --groups            these supplementary groups (none when not given)
 *   --ambient N         keep capability N, and only it, across the user change and the
 *                       exec (ambient): a process that lacks N cannot trace or look into
 *                       one that holds it
 *
 * The inheritable set is always emptied (save --ambient's capability); PROGRAM is looked
 * up in PATH when it has no slash. Exit 126 (and a message) when anything fails.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_GROUPS 256

static void die(const char *what) {
    fprintf(stderr, "maka-setpriv: %s: %s\n", what, strerror(errno));
    exit(126);
}

static void usage(const char *why) {
    fprintf(stderr, "maka-setpriv: %s\n", why);
    exit(126);
}

static unsigned long number(const char *text, int base, const char *what) {
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, base);
    if (errno || *text == '\0' || *end != '\0') usage(what);
    return value;
}

static int last_cap(void) {
    int cap = 0;
    while (cap < 64 && prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0) cap++;
    return cap - 1;
}

static void set_caps(int keep) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &header, data)) die("capget");
    for (int i = 0; i < 2; i++) data[i].inheritable = 0;
    if (keep >= 0) {
        unsigned word = (unsigned)keep / 32, bit = 1u << ((unsigned)keep % 32);
        for (int i = 0; i < 2; i++) data[i].permitted = data[i].effective = 0;
        data[word].permitted = data[word].effective = data[word].inheritable = bit;
    }
    if (syscall(SYS_capset, &header, data)) die("capset");
}

int main(int argc, char **argv) {
    const char *root = NULL, *cd = NULL, *groups = NULL;
    long uid = -1, gid = -1, ambient = -1, drop = -1;
    unsigned long long keep_mask = 0;
    int keep = 0, i = 1;
    for (; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--") == 0) { i++; break; }
        if (i + 1 >= argc) usage("an option lacks its value");
        const char *value = argv[++i];
        if (strcmp(opt, "--root") == 0) root = value;
        else if (strcmp(opt, "--cd") == 0) cd = value;
        else if (strcmp(opt, "--keep-bounding") == 0) {
            keep_mask = strtoull(value, NULL, 16);
            keep = 1;
        } else if (strcmp(opt, "--drop-bounding") == 0) drop = (long)number(value, 10, "--drop-bounding N");
        else if (strcmp(opt, "--uid") == 0) uid = (long)number(value, 10, "--uid N");
        else if (strcmp(opt, "--gid") == 0) gid = (long)number(value, 10, "--gid N");
        else if (strcmp(opt, "--groups") == 0) groups = value;
        else if (strcmp(opt, "--ambient") == 0) ambient = (long)number(value, 10, "--ambient N");
        else usage("unknown option");
    }
    if (i >= argc) usage("no program to run");
    if ((uid < 0) != (gid < 0)) usage("--uid and --gid go together");

    if (root != NULL && (chroot(root) || chdir("/"))) die("chroot");
    int last = last_cap();
    for (int cap = 0; cap <= last; cap++) {
        int dropped = keep ? !((keep_mask >> cap) & 1) : cap == drop;
        if (dropped && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)) die("dropping a bounding capability");
    }
    if (uid >= 0) {
        gid_t list[MAX_GROUPS];
        size_t count = 0;
        if (groups != NULL && *groups != '\0') {
            char *copy = strdup(groups), *save = NULL;
            for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                if (count == MAX_GROUPS) usage("too many groups");
                list[count++] = (gid_t)number(item, 10, "--groups N,N,...");
            }
            free(copy);
        }
        if (ambient >= 0 && prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)) die("keeping capabilities");
        if (setgroups(count, list)) die("setgroups");
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid)) die("setresgid");
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid)) die("setresuid");
    }
    set_caps((int)ambient);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)) die("clearing ambient capabilities");
    if (ambient >= 0 && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, ambient, 0, 0))
        die("raising the ambient capability");
    if (cd != NULL && chdir(cd)) { /* as `cd DIR 2>/dev/null`: the workdir may be gone */ }
    execvp(argv[i], argv + i);
    fprintf(stderr, "maka-setpriv: cannot run %s: %s\n", argv[i], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
