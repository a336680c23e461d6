#!/usr/bin/env bash
# checkpoint_latest.sh: the latest complete checkpoint of a --save folder, as the trainer resumes from it
# (sourced by run_mi300x.sh and examples/zaya1_base/run_zaya1_base.sh, not run).

# checkpoint_latest_iteration DIR: the iteration named by DIR/latest_checkpointed_iteration.txt, or a newer
# complete iter_N (its COMPLETE marker written after that file: a save interrupted between publishing the
# folder and updating the file, which the trainer completes when it resumes); "none" when there is neither.
checkpoint_latest_iteration() {
    local dir=$1 f=$1/latest_checkpointed_iteration.txt marker it named= newest=none
    [[ -z $dir ]] && { echo none; return; }
    [[ -s $f ]] && named=$(tr -d '[:space:]' < "$f")
    for marker in "$dir"/iter_*/COMPLETE; do
        it=${marker%/COMPLETE}; it=${it##*/iter_}
        [[ -f $marker && $it =~ ^[0-9]+$ ]] || continue
        if [[ $named =~ ^[0-9]+$ ]]; then      # only past the named one, completed after the file
            (( 10#$it > 10#$named )) && ! [[ $f -nt $marker ]] || continue
        fi
        if [[ $newest == none ]] || (( 10#$it > newest )); then newest=$(( 10#$it )); fi
    done
    if [[ $newest != none || -z $named ]]; then echo "$newest"; else echo "$named"; fi
}
