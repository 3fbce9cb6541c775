#!/usr/bin/env bash
# Proves that scripts/install-deps.sh notices the absence of each package it lists.
#
# For every row of `install-deps.sh --list` (or the packages given as arguments) this hides
# the package's files in a private mount namespace and runs `install-deps.sh --check` there;
# the row is proven when the check reports exactly that package missing. Files are hidden
# with overlayfs whiteouts on a tmpfs over /usr, /etc, /var and the Rust toolchain, as if
# the package had been removed (symlinks included): nothing on this machine changes and no
# other process sees a difference. A dependency package (default-jre-headless) is hidden
# with the installed packages it depends on; one not installed here (default-jdk-headless)
# is stood in for by those alone.
#
#   scripts/prove-install-deps.sh [PKG...]    one line per package: PASS or FAIL
#   scripts/prove-install-deps.sh --reinstall also, in a namespace, purge libprotobuf-dev
#                                             with dpkg and let install-deps.sh install it
#                                             again (downloads it with apt-get)
#
# Needs root (unshare, mount). docs/setup.md keeps the output of the last run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
install_deps="$here/install-deps.sh"
# Overlaid file trees: where Debian packages and rustup components put files.
SYSROOT=$(rustc --print sysroot)
HOST=$(rustc -vV | sed -n 's/^host: //p')
TREES=(/usr /etc /var "$SYSROOT")

# Mounts an overlay with an empty upper layer over each of TREES (on a tmpfs mounted on
# $PROVE_SCRATCH), then whites out the files of the packages "$@" in it. Only inside a
# private mount namespace.
overlay_and_hide() {
  local root=$PROVE_SCRATCH path dir tree rel
  mount -t tmpfs tmpfs "$root"
  for tree in "${TREES[@]}"; do
    mkdir -p "$root/up$tree" "$root/work$tree"
  done
  [ $# -eq 0 ] || while IFS= read -r path; do
    dir=$(realpath -e "$(dirname "$path")") # /bin/x is /usr/bin/x
    case "$dir/" in
      /usr/* | /etc/* | /var/* | "$SYSROOT"/*) ;;
      *)
        echo "prove-install-deps: cannot hide $path (outside ${TREES[*]})" >&2
        return 1
        ;;
    esac
    mkdir -p "$root/up$dir"
    [ -e "$root/up$dir/${path##*/}" ] || mknod "$root/up$dir/${path##*/}" c 0 0
  done < <(package_files "$@")
  # Upper directories take the owner and mode of the directories they merge with.
  while IFS= read -r dir; do
    rel=${dir#"$root/up"}
    chown --reference="$rel" "$dir" && chmod --reference="$rel" "$dir"
  done < <(find "$root/up" -mindepth 2 -type d)
  for tree in "${TREES[@]}"; do
    mount -t overlay overlay \
      -o "lowerdir=$tree,upperdir=$root/up$tree,workdir=$root/work$tree" "$tree"
  done
}

# What to hide for package $1: the package, if installed here; and when it ships no regular
# file outside /usr/share/doc (a dependency package such as default-jre-headless, whose
# programs come from openjdk-N-jre-headless) also its installed direct dependencies that
# are not rows of the table themselves.
stand_ins() {
  local dep path
  case "$1" in rustup:*)
    echo "$1"
    return
    ;;
  esac
  if installed "$1"; then
    echo "$1"
    while IFS= read -r path; do
      case "$path" in /usr/share/doc/*) continue ;; esac
      if [ -f "$path" ] && [ ! -L "$path" ]; then return; fi
    done < <(dpkg -L "$1")
  fi
  apt-cache depends --no-recommends --no-suggests --no-enhances --no-breaks --no-conflicts \
    --no-replaces "$1" | sed -n 's/^ *|\{0,1\}\(Pre\)\{0,1\}Depends: //p' |
    while read -r dep; do
      if installed "$dep" && ! grep -qx "$dep" <<<"$rows"; then echo "$dep"; fi
    done
}

installed() {
  [ "$(status "$1")" = installed ]
}

# Inside the namespace: hide the packages after "--hide", then run the command after "--".
inside() {
  local hide=()
  while [ "$1" != -- ]; do
    hide+=("$1")
    shift
  done
  shift
  overlay_and_hide "${hide[@]}"
  "$@"
}

# The files (not directories) the packages "$@" installed here; rustup:NAME is the
# toolchain component NAME.
package_files() {
  local pkg path debs=()
  for pkg in "$@"; do
    case "$pkg" in
      rustup:*)
        sed -n "s|^file:|$SYSROOT/|p" \
          "$SYSROOT/lib/rustlib/manifest-${pkg#rustup:}"{,-preview}"-$HOST" 2>/dev/null
        ;;
      *) debs+=("$pkg") ;;
    esac
  done
  [ ${#debs[@]} -gt 0 ] || return 0
  while IFS= read -r path; do
    case "$path" in /*) ;; *) continue ;; esac # "diverted by" notes
    { [ -e "$path" ] || [ -L "$path" ]; } || continue
    { [ -d "$path" ] && [ ! -L "$path" ]; } && continue
    # /lib, /bin...: directories of the package, now symlinks into /usr (merged /usr).
    [ -L "$path" ] && [ "$(dirname "$path")" = / ] && continue
    echo "$path"
  done < <(dpkg -L "${debs[@]}")
}

prove() {
  local pkg=$1 hide out missing unchecked verdict
  mapfile -t hide < <(stand_ins "$pkg")
  if [ ${#hide[@]} -eq 0 ]; then
    printf 'FAIL %-26s nothing installed here stands in for it\n' "$pkg"
    return 1
  fi
  out=$(unshare --mount --propagation private -- "$0" --inside "${hide[@]}" -- \
    "$install_deps" --check) || true
  missing=$(awk '$1 == "missing" { print $2 }' <<<"$out" | paste -sd' ')
  unchecked=$(awk '$1 == "unchecked" { print $2 }' <<<"$out" | paste -sd' ')
  [ "$missing" = "$pkg" ] && verdict=PASS || verdict=FAIL
  printf '%s %-26s hid %s (%s files); --check: missing %s; unchecked: %s\n' "$verdict" "$pkg" \
    "${hide[*]}" "$(package_files "${hide[@]}" | wc -l)" "${missing:-nothing}" "${unchecked:-none}"
  [ "$verdict" = PASS ]
}

# In a namespace: purge libprotobuf-dev with dpkg, then install-deps.sh installs it again.
reinstall() {
  echo "== reinstall: libprotobuf-dev purged in a private namespace, then install-deps.sh"
  local rc=0
  unshare --mount --propagation private -- "$0" --inside -- "$0" --reinstall-steps || rc=$?
  echo "outside the namespace: libprotobuf-dev is $(status libprotobuf-dev)"
  return "$rc"
}

reinstall_steps() {
  dpkg --purge libprotobuf-dev >/dev/null
  echo "dpkg: libprotobuf-dev is $(status libprotobuf-dev)"
  local out
  if out=$("$install_deps" --check); then
    echo "prove-install-deps: --check passed without libprotobuf-dev" >&2
    return 1
  fi
  grep -v '^ok' <<<"$out" | sed 's/^/--check: /'
  "$install_deps"
  echo "dpkg: libprotobuf-dev is $(status libprotobuf-dev)"
}

status() {
  dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null || echo absent
}

main() {
  case "${1:-}" in
    --inside)
      shift
      inside "$@"
      return
      ;;
    --reinstall-steps)
      reinstall_steps
      return
      ;;
  esac
  [ "$(id -u)" -eq 0 ] || {
    echo "prove-install-deps: needs root (unshare, mount)" >&2
    return 1
  }
  PROVE_SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/prove-install-deps.XXXXXX")
  export PROVE_SCRATCH
  trap 'rmdir "$PROVE_SCRATCH"' EXIT
  local do_reinstall=0 pkgs=() failed=0 pkg out
  if [ "${1:-}" = --reinstall ]; then
    do_reinstall=1
    shift
  fi
  rows=$("$install_deps" --list | cut -f1)
  if [ $# -gt 0 ]; then
    pkgs=("$@")
  else
    mapfile -t pkgs <<<"$rows"
  fi

  echo "== baseline: nothing hidden"
  if out=$(unshare --mount --propagation private -- "$0" --inside -- "$install_deps" --check); then
    echo "PASS --check reports every row ok"
  else
    echo "FAIL baseline: $out"
    return 1
  fi
  echo "== each package hidden in turn"
  for pkg in "${pkgs[@]}"; do
    prove "$pkg" || failed=$((failed + 1))
  done
  [ "$do_reinstall" = 0 ] || reinstall || failed=$((failed + 1))
  if [ "$failed" -gt 0 ]; then
    echo "prove-install-deps: $failed FAILED"
    return 1
  fi
  echo "prove-install-deps: all proven"
}

main "$@"
