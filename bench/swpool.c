/* Baseline for bench/pools.sh: the published sw-pool broadcast method, as
 * described: every rank reads a contiguous stripe of the image from shared
 * storage; every 4 KiB block is broadcast on its own (a flag, then the data
 * unless the block is all zero); one rank per node (by host name) writes.
 * Usage: mpirun ... swpool SRC DEST */
#include <mpi.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#define BS 4096

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 3) { if (!rank) fprintf(stderr, "usage: swpool SRC DEST\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
    char host[64] = {0};
    gethostname(host, sizeof host - 1);
    char *all = malloc(64 * (size_t)size);
    MPI_Allgather(host, 64, MPI_CHAR, all, 64, MPI_CHAR, MPI_COMM_WORLD);
    int leader = 1;
    for (int r = 0; r < rank; r++) if (!memcmp(all + 64 * r, host, 64)) leader = 0;
    long long len = 0;
    int fd = open(argv[1], O_RDONLY);
    if (rank == 0) { struct stat st; if (fd < 0 || fstat(fd, &st)) { perror(argv[1]); MPI_Abort(MPI_COMM_WORLD, 1); } len = st.st_size; }
    MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    int out = -1;
    if (leader) {
        out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0 || ftruncate(out, len)) { perror(argv[2]); MPI_Abort(MPI_COMM_WORLD, 1); }
    }
    long long nblocks = (len + BS - 1) / BS, per = (nblocks + size - 1) / size;
    static char buf[BS], zero[BS];
    long long bytes_read = 0;
    for (long long b = 0; b < nblocks; b++) {
        int owner = (int)(b / per);
        long long off = b * BS;
        int n = (int)(len - off < BS ? len - off : BS);
        char flag = 0;
        if (rank == owner) {
            if (pread(fd, buf, n, off) != n) { perror("pread"); MPI_Abort(MPI_COMM_WORLD, 1); }
            bytes_read += n;
            flag = memcmp(buf, zero, n) != 0;
        }
        MPI_Bcast(&flag, 1, MPI_CHAR, owner, MPI_COMM_WORLD);
        if (!flag) continue;
        MPI_Bcast(buf, n, MPI_CHAR, owner, MPI_COMM_WORLD);
        if (leader && pwrite(out, buf, n, off) != n) { perror("pwrite"); MPI_Abort(MPI_COMM_WORLD, 1); }
    }
    if (leader) { fsync(out); close(out); }
    long long total = 0;
    MPI_Reduce(&bytes_read, &total, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("{\"bytes_read\":%lld}\n", total);
    MPI_Finalize();
    return 0;
}
