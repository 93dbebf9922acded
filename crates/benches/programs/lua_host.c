/* The Lua host of the accuracy harness: the stand-alone interpreter's core
 * (luaL_newstate, the standard libraries, luaL_dofile) running the script
 * named by argv[1]. Lua's own lua.c adds a REPL and signal handling that
 * the harness does not need. */
#include <stdio.h>
#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRIPT.lua\n", argv[0]);
        return 2;
    }
    lua_State *L = luaL_newstate();
    if (!L) return 1;
    luaL_openlibs(L);
    int rc = luaL_dofile(L, argv[1]);
    if (rc != LUA_OK) fprintf(stderr, "%s\n", lua_tostring(L, -1));
    lua_close(L);
    return rc == LUA_OK ? 0 : 1;
}
