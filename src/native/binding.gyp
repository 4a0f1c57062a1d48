{
  "targets": [
    {
      "target_name": "roce_icrc",
      "sources": ["icrc.c", "watch.c", "mmsg.c"],
      "cflags": ["-O3", "-std=c11", "-Wall", "-Wextra"],
      "xcode_settings": { "OTHER_CFLAGS": ["-O3", "-std=c11"] }
    }
  ]
}
