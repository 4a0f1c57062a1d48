#!/bin/sh
# lab-agent: the guest's command loop. The host (interop/lab.ts) sends one request per line,
# the agent answers each with a header line and a length-prefixed body:
#
#   host -> guest   H <id>                         hello: report READY/FAIL and the GID indexes
#                   R <id> <seconds> <base64 sh>   run a command, wait, reply with rc + output
#                   S <id> <seconds> <base64 sh>   start a background job <id>, reply at once
#                   P <id> <job>                   poll a job: rc -1 while it runs, else rc + output
#                   K <id> <job>                   send SIGTERM to a job (its rc is then collected by P)
#   guest -> host   @@<verb> <id> <rc> <length>\n<length bytes of output (stdout+stderr)>
#
# Why virtio-serial (a virtserialport named "lab.agent", a unix socket on the host) rather than
# a TCP service on eth0 or the serial console:
#  - it is outside the network under test: no extra TCP frames in bridge captures, and it keeps
#    working when a test changes the MTU, adds netem loss or breaks eth0;
#  - it is a plain byte pipe: no tty line discipline (echo, CR/LF rewriting, flow control) and
#    no kernel messages interleaved, which the console (ttyS0, lines end in \r) has;
#  - it needs no listener process (busybox nc) whose restart could race with the next request;
#  - the length prefix makes any output, binary or containing marker strings, unambiguous.
# Every command runs under coreutils 'timeout' (rxe retries forever with retry_cnt=7, so an
# unanswered client would otherwise never end); rc 124 means the time bound hit.
#
# Requests are served one at a time; background jobs (S) let a test keep a server running in
# this guest while other requests are served.

jobs=/run/lab
mkdir -p "$jobs"

# Commands run in /bin/sh (busybox ash), which prefers its own applets to $PATH; these
# functions make ip/tc/timeout mean the real tools inside test commands too.
cat > "$jobs/prelude.sh" <<'PRELUDE'
ip() { /usr/sbin/ip "$@"; }
tc() { /usr/sbin/tc "$@"; }
timeout() { /usr/bin/timeout "$@"; }
cd /tmp
PRELUDE

say() { echo "lab-agent: $*" > /dev/console; }

# The port's device node is /dev/vportNpM; find it by its name.
port=
while [ -z "$port" ]; do
  for d in /sys/class/virtio-ports/*; do
    n=; read -r n < "$d/name" 2>/dev/null
    [ "$n" = lab.agent ] && [ -e "/dev/${d##*/}" ] && port=/dev/${d##*/}
  done
  [ -n "$port" ] || sleep 0.2
done

# reply VERB ID RC [FILE]
reply() {
  len=0
  [ -n "$4" ] && [ -f "$4" ] && len=$(($(wc -c < "$4")))
  printf '@@%s %s %s %s\n' "$1" "$2" "$3" "$len" >&3
  [ "$len" -gt 0 ] && cat "$4" >&3
}

# script ID BASE64 -> $jobs/ID.sh (prelude + the command)
script() {
  { echo ". $jobs/prelude.sh"; echo "$2" | base64 -d; echo; } > "$jobs/$1.sh"
}

hello() {
  if [ -n "$LAB_FAIL" ]; then
    echo "FAIL $LAB_FAIL" > "$jobs/hello"
  else
    read -r up _ < /proc/uptime
    echo "READY name=$LAB_NAME gid4=$LAB_GID4 gid6=$LAB_GID6 uptime=$up" > "$jobs/hello"
  fi
  reply H "$1" 0 "$jobs/hello"
}

serve() {
  while read -r verb id arg data <&3; do
    case $verb in
      H) hello "$id" ;;
      R)
        script "$id" "$data"
        /usr/bin/timeout -k 2 "$arg" /bin/sh "$jobs/$id.sh" > "$jobs/$id.out" 2>&1 < /dev/null 3>&-
        rc=$?
        reply R "$id" "$rc" "$jobs/$id.out"
        rm -f "$jobs/$id.sh" "$jobs/$id.out" ;;
      S)
        script "$id" "$data"
        # The inner job is timeout's own process (it runs the command in its own process group
        # and forwards SIGTERM to it); its pid file lets K stop it early.
        (
          /usr/bin/timeout -k 2 "$arg" /bin/sh "$jobs/$id.sh" > "$jobs/$id.out" 2>&1 < /dev/null &
          echo $! > "$jobs/$id.pid"
          wait $!
          echo $? > "$jobs/$id.rc.tmp" && mv "$jobs/$id.rc.tmp" "$jobs/$id.rc"
        ) 3>&- &
        while [ ! -f "$jobs/$id.pid" ]; do sleep 0.01; done
        reply S "$id" 0 ;;
      P)
        if [ -f "$jobs/$arg.rc" ]; then
          read -r rc < "$jobs/$arg.rc"
          reply P "$id" "$rc" "$jobs/$arg.out"
          rm -f "$jobs/$arg".*
        elif [ -f "$jobs/$arg.pid" ]; then
          reply P "$id" -1
        else
          echo "no such job: $arg" > "$jobs/err"; reply P "$id" -2 "$jobs/err"
        fi ;;
      K)
        if [ -f "$jobs/$arg.pid" ] && [ ! -f "$jobs/$arg.rc" ]; then
          read -r pid < "$jobs/$arg.pid"; kill -TERM "$pid" 2>/dev/null
        fi
        reply K "$id" 0 ;;
      '') ;;
      *) echo "unknown request: $verb" > "$jobs/err"; reply E "$id" 2 "$jobs/err" ;;
    esac
  done
}

# read returns EOF whenever the host side is not connected; reopen and go on. This process is
# PID 1, so it must never exit.
while :; do
  if exec 3<>"$port"; then
    serve
    exec 3>&-
  fi
  sleep 0.2
done
