/* The host program for the SQLite evaluation: opens an in-memory database,
 * runs the SQL script named by argv[1] with sqlite3_exec, and prints every
 * result row (so the output can be compared across builds). SQLite ships as
 * a library; this is the smallest program that drives it. */
#include <stdio.h>
#include <stdlib.h>
#include "sqlite3.h"

static int print_row(void *unused, int n, char **values, char **names) {
    (void)unused;
    (void)names;
    for (int i = 0; i < n; i++) printf("%s%s", i ? "|" : "", values[i] ? values[i] : "NULL");
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRIPT.sql\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *sql = malloc(n + 1);
    if (!sql || fread(sql, 1, n, f) != (size_t)n) {
        fprintf(stderr, "%s: read failed\n", argv[1]);
        return 1;
    }
    sql[n] = 0;
    fclose(f);
    sqlite3 *db;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK) {
        fprintf(stderr, "sqlite3_open: %s\n", sqlite3_errmsg(db));
        return 1;
    }
    char *err = NULL;
    if (sqlite3_exec(db, sql, print_row, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", argv[1], err);
        return 1;
    }
    sqlite3_close(db);
    free(sql);
    return 0;
}
